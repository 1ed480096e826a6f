"""Frames wait for their odometry over real DDS (``pose_source: topic``, ``pose_wait_s``): odometry
published after the frame, late by less than the wait, gives the frame the pose interpolated at its
stamp; odometry that never comes lets the frame in after the wait without a pose, counted."""

from __future__ import annotations

import math
import time

import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from nav_msgs.msg import Odometry
from sensor_msgs.msg import Image
from videokv_node.ros.conversions import time_to_ns
from videokv_node.programs.synthetic_camera import image_msg

from tests.integration.test_node_ros import running_node, wait_subscribed
from tests.integration.test_pose_locate_ros import RELIABLE, frame, odom, truth
from tests.integration.test_tf_poses_ros import PoseStatus

NS = 1_000_000_000
MS = 1_000_000


def assert_truth(pose, stamp_ns: int) -> None:
    """The pose is the published trajectory interpolated at ``stamp_ns`` (exact: the trajectory is linear)."""
    x, yaw = truth(stamp_ns)
    p, q = pose.pose.position, pose.pose.orientation
    assert pose.header.frame_id == "odom", stamp_ns
    assert abs(p.x - x) < 1e-6 and abs(p.y + 2 * x) < 1e-6, (stamp_ns, p, x)
    assert abs(q.z - math.sin(yaw / 2)) < 1e-6 and abs(q.w - math.cos(yaw / 2)) < 1e-6, (stamp_ns, q)


def test_a_frame_waits_for_late_odometry_and_one_whose_odometry_never_comes_is_ingested_without_pose(ros):
    params = {"model": "tiny", "image_topics": ["cam_w"], "camera_qos": "reliable", "camera_qos_depth": 50,
              "sample_fps": 0.0, "stats_period_s": 0.2, "diagnostics_period_s": 0.2,
              "memory.policy": "rekv", "memory.budget_tokens": 1024, "memory.local_window_tokens": 32,
              "memory.retrieve_frames": 8, "max_new_tokens": 2,
              "pose_topic": "odom", "pose_type": "odometry", "pose_tolerance_s": 0.1, "pose_wait_s": 5.0}
    with running_node(ros, params, "videokv_pose_wait") as (proc, client, peer):
        pub_odom = peer.create_publisher(Odometry, "/odom", RELIABLE)
        pub_cam = peer.create_publisher(Image, "/cam_w", RELIABLE)
        status = PoseStatus(peer, ros[1])
        wait_subscribed(pub_odom)
        wait_subscribed(pub_cam)
        for s in (10 * NS, 10 * NS + 100 * MS):
            pub_odom.publish(odom(s, *truth(s)))
        time.sleep(0.5)
        a0 = 10 * NS + 50 * MS  # inside the odometry received: in at once
        pub_cam.publish(image_msg(frame(0), a0))
        client.wait_stats(lambda st: st.frames_ingested == 1 and st.queue_depth == 0, timeout=60)

        # 50 ms past the newest odometry: within pose_tolerance_s, so without waiting it would get the 10.1 s
        # pose. It waits, parked (questions are answered meanwhile), for the odometry past its stamp.
        a = 10 * NS + 150 * MS
        pub_cam.publish(image_msg(frame(1), a))
        status.wait(lambda v: v["frames_waiting_for_tf"] == "1", timeout=4.0)
        answer = client.ask("What is there?")
        assert answer.success, answer.message
        assert [time_to_ns(t) for t in answer.evidence_stamps] == [a0]  # a is not in the memory yet
        for s in (10 * NS + 200 * MS, 10 * NS + 300 * MS):  # the odometry, late by about a second
            pub_odom.publish(odom(s, *truth(s)))
        client.wait_stats(lambda st: st.frames_ingested == 2 and st.queue_depth == 0, timeout=60)

        # Odometry stops: a frame 20 s past it waits pose_wait_s, then is ingested without a pose, counted.
        b = 30 * NS
        t0 = time.monotonic()
        pub_cam.publish(image_msg(frame(2), b))
        status.wait(lambda v: v["frames_waiting_for_tf"] == "1", timeout=4.0)
        client.wait_stats(lambda st: st.frames_ingested == 3 and st.queue_depth == 0, timeout=60)
        assert time.monotonic() - t0 >= 4.5  # it waited (about) pose_wait_s on the node clock

        resp = client.ask("What is there?")
        assert resp.success, resp.message
        got = {time_to_ns(s): p for s, p in zip(resp.evidence_stamps, resp.evidence_poses)}
        assert sorted(got) == [a0, a, b]
        assert_truth(got[a0], a0)
        assert_truth(got[a], a)
        assert got[b].header.frame_id == ""

        values = status.wait(lambda v: v["frames_without_pose"] == "1")
        assert (values["frames_with_pose"], values["frames_without_pose_outside_span"]) == ("2", "1"), values
        assert values["frames_waiting_for_tf"] == "0" and values["frames_waited_for_tf"] == "1", values
        assert values["tf_waits_cut_short"] == "0", values
    assert "gets no pose (topic outside_span" in proc.output()
