"""Poses and ~/locate over real DDS: odometry and images published to a node process, the
evidence's poses checked against the pose interpolated by hand at each frame's stamp."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus  # noqa: E402
from nav_msgs.msg import Odometry  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from tests.integration.test_node_ros import running_node, wait_subscribed  # noqa: E402
from videokv_node.ros.conversions import ns_to_time, time_to_ns  # noqa: E402
from videokv_node.programs.synthetic_camera import image_msg  # noqa: E402

NS = 1_000_000_000
RELIABLE = QoSProfile(depth=500, reliability=ReliabilityPolicy.RELIABLE)
PARAMETERS_MD = Path(__file__).resolve().parents[2] / "docs" / "PARAMETERS.md"


def odom(stamp_ns: int, x: float, yaw: float) -> Odometry:
    msg = Odometry()
    msg.header.stamp = ns_to_time(stamp_ns)
    msg.header.frame_id = "odom"
    msg.child_frame_id = "base_link"
    p, q = msg.pose.pose.position, msg.pose.pose.orientation
    p.x, p.y = x, -2.0 * x
    q.z, q.w = math.sin(yaw / 2), math.cos(yaw / 2)
    return msg


def truth(stamp_ns: int) -> tuple[float, float]:
    """The trajectory published: x = t - 10 s, heading 0.1 rad per second; both linear in time, so the
    interpolated pose at any stamp inside the poses' span is exactly the trajectory there."""
    t = stamp_ns / NS - 10.0
    return t, 0.1 * t


def frame(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (24, 32, 3), dtype=np.uint8)


def test_frames_get_the_pose_at_their_stamp_and_locate_ranks_them_over_dds(ros):
    params = {
        "model": "tiny",
        "image_topics": ["cam_a"],
        "camera_qos": "reliable",
        "camera_qos_depth": 100,
        "sample_fps": 0.0,
        "stats_period_s": 0.2,
        "memory.policy": "rekv",
        "memory.budget_tokens": 1024,
        "memory.local_window_tokens": 32,
        "memory.retrieve_frames": 8,
        "max_new_tokens": 2,
        "pose_topic": "odom",  # pose_type auto: the node reads the type from the graph
        "pose_tolerance_s": 0.1,
        "locate_max_k": 5,
        "diagnostics_period_s": 0.3,
    }
    with running_node(ros, params, "videokv_pose") as (proc, client, peer):
        pub_odom = peer.create_publisher(Odometry, "/odom", RELIABLE)
        pub_cam = peer.create_publisher(Image, "/cam_a", RELIABLE)
        wait_subscribed(pub_odom, timeout=30)  # the node subscribes once it has seen the topic's type
        wait_subscribed(pub_cam)
        for i in range(61):  # 10 Hz from 10 s to 16 s
            s = 10 * NS + i * NS // 10
            pub_odom.publish(odom(s, *truth(s)))
            if i == 5:  # bad input, both dropped and counted: a NaN, and a stamp going backwards
                pub_odom.publish(odom(s + NS // 20, math.nan, 0.0))
                pub_odom.publish(odom(s - NS // 20, 100.0, 3.0))
            time.sleep(0.01)
        time.sleep(1.0)  # every pose in before the first frame is sampled
        stamps = [10 * NS + 470_000_000, 11 * NS + 230_000_000, 12 * NS, 13 * NS + 910_000_000, 16 * NS + 50_000_000,
                  20 * NS]  # the last is 4 s after the newest pose: no pose
        for i, s in enumerate(stamps):
            pub_cam.publish(image_msg(frame(i), s))
            time.sleep(0.05)
        client.wait_stats(lambda st: st.frames_ingested == len(stamps) and st.queue_depth == 0, timeout=120)

        resp = client.ask("What is there?")
        assert resp.success, resp.message
        got = [time_to_ns(t) for t in resp.evidence_stamps]
        assert got == stamps  # the whole memory fits the retrieval
        assert len(resp.evidence_poses) == len(got)
        for s, pose in zip(got, resp.evidence_poses):
            assert time_to_ns(pose.header.stamp) == s
            if s == 20 * NS:
                assert pose.header.frame_id == ""  # outside the poses' span by more than pose_tolerance_s
                continue
            x, yaw = truth(min(s, 16 * NS))  # 16.05 s: within the tolerance after the newest pose (16 s)
            p, q = pose.pose.position, pose.pose.orientation
            assert pose.header.frame_id == "odom"
            assert abs(p.x - x) < 1e-6 and abs(p.y + 2 * x) < 1e-6 and p.z == 0.0, (s, p)
            assert abs(q.z - math.sin(yaw / 2)) < 1e-6 and abs(q.w - math.cos(yaw / 2)) < 1e-6, (s, q)

        # The ~/ask action's result carries the same evidence poses as the service's answer.
        assert client.wait_action_ready(timeout=60), proc.output()
        streamed = client.ask_stream("What is there?")
        assert streamed.result.success, streamed.result.message
        assert [time_to_ns(t) for t in streamed.result.evidence_stamps] == stamps
        assert len(streamed.result.evidence_poses) == len(stamps)
        for s, served, acted in zip(stamps, resp.evidence_poses, streamed.result.evidence_poses):
            assert time_to_ns(acted.header.stamp) == s
            assert acted.header.frame_id == served.header.frame_id and acted.pose == served.pose, (s, acted)

        loc = client.locate("a red box", top_k=3)
        assert loc.success, loc.message
        assert loc.method == "retrieval+likelihood"  # re-ranked by default (answer.locate_rerank)
        assert len(loc.stamps) == len(loc.poses) == len(loc.scores) == 3
        assert list(loc.scores) == sorted(loc.scores, reverse=True) and loc.latency_s > 0
        by_stamp = {s: p for s, p in zip(got, resp.evidence_poses)}
        for t, pose, cam in zip(loc.stamps, loc.poses, loc.cameras):
            s = time_to_ns(t)
            assert s in by_stamp and cam == "/cam_a"
            assert pose.header.frame_id == by_stamp[s].header.frame_id and pose.pose == by_stamp[s].pose
        window = client.locate("a red box", top_k=5, since_ns=11 * NS, until_ns=13 * NS)
        assert window.success and {time_to_ns(t) for t in window.stamps} == {11 * NS + 230_000_000, 12 * NS}

        # /diagnostics counts it all: 5 frames with a pose, 1 without, both bad poses dropped.
        got_status = []
        peer.create_subscription(DiagnosticArray, "/diagnostics",
                                 lambda m: got_status.extend(s for s in m.status if s.name == "videokv: poses"), 10)
        executor = SingleThreadedExecutor(context=ros[1])
        executor.add_node(peer)
        deadline = time.monotonic() + 30
        while not got_status and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.2)
        executor.remove_node(peer)
        assert got_status, "no 'videokv: poses' status on /diagnostics"
        values = {kv.key: kv.value for kv in got_status[-1].values}
        assert (values["frames_with_pose"], values["frames_without_pose"]) == ("5", "1"), values
        assert values["frames_without_pose_outside_span"] == "1" and values["frames_waiting_for_tf"] == "0", values
        assert (values["dropped_non_finite"], values["dropped_backwards"]) == ("1", "1"), values
        assert got_status[-1].level == DiagnosticStatus.WARN  # the newest frame (20 s) got no pose

        for request, reason in (((" ", 3), "empty"), (("a red box", 0), "top_k"), (("a red box", 6), "locate_max_k"),
                                (("a red box", 2, ["cam_z"]), "no frames")):
            r = client.locate(*request)
            assert not r.success and reason in r.message, (request, r.message)
    out = proc.output()
    assert "non-finite" in out and "not after the newest" in out  # both bad poses dropped, with a warning


def test_pose_and_locate_parameters_are_in_the_parameter_reference():
    from videokv_node.ros.params import parameter_table

    readme = PARAMETERS_MD.read_text()
    mine = [n for n in parameter_table() if n.startswith("pose_") or n in ("base_frame", "locate_max_k")]
    assert len(mine) == 11
    assert not [n for n in mine if not re.search(rf"^\| `{n}` \|", readme, re.MULTILINE)]


def test_spava_answers_cite_the_poses_sent_with_the_frames():
    """The node sends each archived frame's pose in the LongReplay goal; the service's answers cite them
    by (camera, stamp) in evidence_poses, an empty frame_id for a frame sent without one."""
    from videokv_interfaces.action import LongReplay

    from videokv_node.pose import Pose
    from videokv_node.ros.conversions import pose_to_msg
    from videokv_node.programs.long_replay import fill_result, goal_poses
    from videokv_node.ingest.frame_archive import FrameArchive
    from videokv_node.spava.job import ReplayAnswer, ReplayOutcome

    archive = FrameArchive(1 << 20, 90)
    pose = Pose.make("odom", (1.0, 2.0, 0.0), (0.0, 0.0, math.sin(0.2), math.cos(0.2)))
    archive.add("/cam", 5 * NS, frame(0), pose)
    archive.add("/cam", 6 * NS, frame(1), None)
    window = archive.window(0, 0, [], 10)
    assert [(c, s, p) for c, s, _, p in window] == [("/cam", 5 * NS, pose), ("/cam", 6 * NS, None)]

    goal = LongReplay.Goal(frames=[image_msg(rgb, s) for _, s, rgb, _ in window], frame_cameras=["/cam", "/cam"],
                           frame_poses=[pose_to_msg(p, s) for _, s, _, p in window])
    poses = goal_poses(goal)
    outcome = ReplayOutcome(True, "", [ReplayAnswer(True, evidence_stamps_ns=[5 * NS, 6 * NS], evidence_cameras=["/cam", "/cam"])])
    result = fill_result(LongReplay.Result(), outcome, 1.0, poses)
    cited = result.answers[0].evidence_poses
    assert [time_to_ns(p.header.stamp) for p in cited] == [5 * NS, 6 * NS]
    assert cited[0].header.frame_id == "odom" and cited[0].pose.position.x == 1.0
    assert abs(cited[0].pose.orientation.z - math.sin(0.2)) < 1e-12
    assert cited[1].header.frame_id == ""
    goal.frame_poses = goal.frame_poses[:1]  # misaligned: refused with the reason
    with pytest.raises(ValueError, match="1 frame_poses for 2 frames"):
        goal_poses(goal)


def test_pose_source_tf_is_refused_with_the_reason_where_tf2_ros_is_missing(monkeypatch):
    from videokv_node.ingest.pose_history import PoseConfig
    from videokv_node.memory.config import ConfigError
    from videokv_node.ros import pose_intake

    monkeypatch.setattr(pose_intake, "tf2_available", lambda: False)
    with pytest.raises(ConfigError, match="pose_source tf needs tf2_ros .* ../shared/ros2tools"):
        pose_intake.check_available(PoseConfig(pose_source="tf"))
    pose_intake.check_available(PoseConfig(pose_topic="odom"))  # topic poses need nothing more


def test_every_pose_message_type_gives_its_stamp_frame_and_pose():
    from geometry_msgs.msg import PoseStamped, PoseWithCovarianceStamped

    from videokv_node.ros.conversions import msg_to_pose, pose_fields, pose_to_msg
    from videokv_node.ros.pose_intake import TYPE_NAMES, message_class

    want = (12 * NS + 5, "odom", (1.0, -2.0, 0.5), (0.0, 0.0, math.sin(0.3), math.cos(0.3)))
    for msg in (Odometry(), PoseStamped(), PoseWithCovarianceStamped()):
        msg.header.stamp, msg.header.frame_id = ns_to_time(want[0]), want[1]
        pose = msg.pose.pose if hasattr(msg.pose, "pose") else msg.pose
        pose.position.x, pose.position.y, pose.position.z = want[2]
        pose.orientation.x, pose.orientation.y, pose.orientation.z, pose.orientation.w = want[3]
        assert pose_fields(msg) == want, type(msg).__name__
    assert {k: message_class(k).__name__ for k in TYPE_NAMES} == {
        "odometry": "Odometry", "pose_stamped": "PoseStamped", "pose_with_covariance_stamped": "PoseWithCovarianceStamped"}
    empty = pose_to_msg(None, 7 * NS)
    assert empty.header.frame_id == "" and time_to_ns(empty.header.stamp) == 7 * NS and msg_to_pose(empty) is None
