"""Still frames over real DDS (issue 36): a still view, a thing for two frames, the view again, published
to a node with ``memory.redundancy.enabled``; ~/memory_stats counts the merged frames, ~/ask (service and
action) and ~/locate give each span's first and last stamp, and the poses at both ends."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from nav_msgs.msg import Odometry  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from tests.integration.test_node_ros import running_node, wait_subscribed  # noqa: E402
from tests.integration.test_pose_locate_ros import odom  # noqa: E402
from videokv_node.ros.conversions import time_to_ns  # noqa: E402
from videokv_node.programs.synthetic_camera import image_msg  # noqa: E402

NS = 1_000_000_000
RELIABLE = QoSProfile(depth=500, reliability=ReliabilityPolicy.RELIABLE)


def view(seed: int, i: int, thing: bool = False) -> np.ndarray:
    base = np.kron(np.random.default_rng(seed).integers(40, 216, (6, 8, 3)), np.ones((8, 8, 1)))
    if thing:
        base[8:24, 16:32] = (255, 0, 0)
    noise = np.random.default_rng(100 + i).normal(0, 1.5, base.shape)
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def test_spans_on_every_surface_over_dds(ros):
    params = {
        "model": "tiny", "image_topics": ["cam_a"], "camera_qos": "reliable", "camera_qos_depth": 100,
        "sample_fps": 0.0, "stats_period_s": 0.2, "memory.policy": "rekv", "memory.budget_tokens": 1024,
        "memory.local_window_tokens": 32, "memory.retrieve_frames": 8, "max_new_tokens": 2,
        "memory.redundancy.enabled": True, "pose_topic": "odom", "pose_tolerance_s": 0.1, "locate_max_k": 5,
    }
    kinds = "aaaattaaa"  # stored: 0 (1-3 merged), 4 (5 merged), 6 (7-8 merged)
    stamps = [(10 + i) * NS for i in range(len(kinds))]
    with running_node(ros, params, "videokv_still") as (proc, client, peer):
        pub_odom = peer.create_publisher(Odometry, "/odom", RELIABLE)
        pub_cam = peer.create_publisher(Image, "/cam_a", RELIABLE)
        wait_subscribed(pub_odom, timeout=30)
        wait_subscribed(pub_cam)
        for i in range(0, 10 * len(kinds) + 11):  # 10 Hz from 9.5 s: x = t
            s = 9 * NS + NS // 2 + i * NS // 10
            pub_odom.publish(odom(s, s / NS, 0.0))
            time.sleep(0.005)
        time.sleep(1.0)
        for i, (s, k) in enumerate(zip(stamps, kinds)):
            pub_cam.publish(image_msg(view(1, i, thing=k == "t"), s))
            time.sleep(0.05)
        stats = client.wait_stats(lambda st: st.frames_ingested == len(stamps) and st.queue_depth == 0, timeout=120)
        assert (stats.frames_merged, stats.frames_in_memory) == (6, 3), proc.output()

        spans = {stamps[0]: stamps[3], stamps[4]: stamps[5], stamps[6]: stamps[8]}
        resp = client.ask("What is there?")
        assert resp.success, resp.message
        got = [time_to_ns(t) for t in resp.evidence_stamps]
        assert got == sorted(spans)
        assert [time_to_ns(t) for t in resp.evidence_last_stamps] == [spans[s] for s in got]
        for s, first, last in zip(got, resp.evidence_poses, resp.evidence_last_poses):
            assert math.isclose(first.pose.position.x, s / NS, abs_tol=1e-6)
            assert time_to_ns(last.header.stamp) == spans[s] and math.isclose(last.pose.position.x, spans[s] / NS, abs_tol=1e-6)

        assert client.wait_action_ready(timeout=60), proc.output()
        streamed = client.ask_stream("What is there?")
        assert [time_to_ns(t) for t in streamed.result.evidence_last_stamps] == [spans[s] for s in got]

        loc = client.locate("a red box", top_k=3)
        assert loc.success, loc.message
        assert {time_to_ns(t): time_to_ns(u) for t, u in zip(loc.stamps, loc.last_stamps)} == spans
        # a window inside a span finds the span's stored frame
        window = client.locate("a red box", top_k=1, since_ns=stamps[2], until_ns=stamps[3])
        assert window.success and [time_to_ns(t) for t in window.stamps] == [stamps[0]], window.message
