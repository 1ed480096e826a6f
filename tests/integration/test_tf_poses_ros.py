"""``pose_source: tf`` (issue 33): poses from a live tf tree over real DDS, with tf2_ros broadcasters.

A static map->odom and a dynamic odom->base_link, composed by the node's tf2 buffer; camera frames
stamped newer than the newest transform (they wait for it), a tf that stalls and comes back late, and a
frame whose transform never comes (ingested without a pose, counted with its reason). Each pose is
checked against the composition computed here. tf2_ros is ROS 2's (apt) or, with the PyPI wheels,
../shared/ros2tools' build (`make build`, on the path through env.sh); these tests skip only where
neither exists, and fail where ros2tools is there but tf2_ros does not import.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from geometry_msgs.msg import TransformStamped  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from tests.integration.test_node_ros import running_node, wait_subscribed  # noqa: E402
from videokv_node.ros.conversions import ns_to_time, time_to_ns  # noqa: E402
from videokv_node.programs.synthetic_camera import image_msg  # noqa: E402

NS = 1_000_000_000
MS = 1_000_000
RELIABLE = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
SHARED_TOOLS = Path(__file__).resolve().parents[3] / "shared" / "ros2tools" / "setup.sh"
STATIC_XY, STATIC_YAW = (1.0, 2.0), math.pi / 2  # map -> odom


def tf2_ros_module():
    try:
        import tf2_ros
    except ImportError as exc:
        if SHARED_TOOLS.exists():
            pytest.fail(f"tf2_ros does not import ({exc}) though {SHARED_TOOLS.parent} is there: "
                        "`make build` builds it into .ros2tools and env.sh puts it on the path")
        pytest.skip("tf2_ros absent: neither ROS 2 from apt nor ../shared/ros2tools")
    return tf2_ros


def quat(yaw: float) -> tuple[float, float, float, float]:
    return 0.0, 0.0, math.sin(yaw / 2), math.cos(yaw / 2)


def odom_base(stamp_ns: int) -> tuple[tuple[float, float, float], tuple[float, float, float, float]]:
    """odom -> base_link: x = t - 10 s, y = x / 2, heading 0.1 rad/s; linear in time, so tf2's
    interpolation between two broadcasts is exactly the trajectory."""
    x = stamp_ns / NS - 10.0
    return (x, 0.5 * x, 0.0), quat(0.1 * x)


def hamilton(a, b):
    ax, ay, az, aw = a
    bx, by, bz, bw = b
    return (aw * bx + ax * bw + ay * bz - az * by, aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw, aw * bw - ax * bx - ay * by - az * bz)


def map_base(stamp_ns: int):
    """map -> base_link composed here: p = R_static p_dyn + t_static, q = q_static q_dyn."""
    p, q = odom_base(stamp_ns)
    c, s = math.cos(STATIC_YAW), math.sin(STATIC_YAW)
    rot = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    pos = rot @ np.array(p) + np.array([*STATIC_XY, 0.0])
    return tuple(pos), hamilton(quat(STATIC_YAW), q)


def transform(parent: str, child: str, stamp_ns: int, xyz, q) -> TransformStamped:
    t = TransformStamped()
    t.header.stamp, t.header.frame_id, t.child_frame_id = ns_to_time(stamp_ns), parent, child
    t.transform.translation.x, t.transform.translation.y, t.transform.translation.z = xyz
    r = t.transform.rotation
    r.x, r.y, r.z, r.w = q
    return t


def broadcast(broadcaster, start_ns: int, stop_ns: int, step_ns: int = 50 * MS) -> None:
    """odom -> base_link at every ``step_ns`` from ``start_ns`` to ``stop_ns`` (20 Hz of stamps, sent quickly)."""
    for s in range(start_ns, stop_ns + 1, step_ns):
        broadcaster.sendTransform(transform("odom", "base_link", s, *odom_base(s)))
        time.sleep(0.005)


def frame(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (24, 32, 3), dtype=np.uint8)


def assert_pose(pose, stamp_ns: int) -> None:
    want_p, want_q = map_base(stamp_ns)
    p, q = pose.pose.position, pose.pose.orientation
    assert pose.header.frame_id == "map", stamp_ns
    assert np.allclose((p.x, p.y, p.z), want_p, atol=1e-6), (stamp_ns, p, want_p)
    sign = 1.0 if q.w * want_q[3] >= 0 else -1.0  # q and -q are one rotation
    assert np.allclose((q.x, q.y, q.z, q.w), [sign * v for v in want_q], atol=1e-6), (stamp_ns, q, want_q)


class PoseStatus:
    """The node's "videokv: poses" status on /diagnostics, read by spinning the peer node."""

    def __init__(self, peer: Node, ctx) -> None:
        self.latest: dict[str, str] | None = None
        peer.create_subscription(DiagnosticArray, "/diagnostics", self._callback, 10)
        self._executor = SingleThreadedExecutor(context=ctx)
        self._executor.add_node(peer)

    def _callback(self, msg) -> None:
        for status in msg.status:
            if status.name == "videokv: poses":
                self.latest = {kv.key: kv.value for kv in status.values}

    def wait(self, predicate, timeout: float = 30.0) -> dict[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._executor.spin_once(timeout_sec=0.1)
            if self.latest is not None and predicate(self.latest):
                return self.latest
        raise AssertionError(f"'videokv: poses' never satisfied the condition; last: {self.latest}")


def test_frames_wait_for_a_late_tf_and_get_the_composed_pose_over_dds(ros):
    tf2_ros = tf2_ros_module()
    params = {"model": "tiny", "image_topics": ["cam_t"], "camera_qos": "reliable", "camera_qos_depth": 50,
              "sample_fps": 0.0, "stats_period_s": 0.2, "diagnostics_period_s": 0.2,
              "memory.policy": "rekv", "memory.budget_tokens": 1024, "memory.local_window_tokens": 32,
              "memory.retrieve_frames": 8, "max_new_tokens": 2,
              "pose_source": "tf", "pose_frame": "map", "base_frame": "base_link",
              "pose_tf_wait_s": 5.0, "pose_tolerance_s": 0.1}
    with running_node(ros, params, "videokv_tf") as (proc, client, peer):
        static = tf2_ros.StaticTransformBroadcaster(peer)
        dynamic = tf2_ros.TransformBroadcaster(peer)
        pub_cam = peer.create_publisher(Image, "/cam_t", RELIABLE)
        status = PoseStatus(peer, ros[1])
        for pub in (static.pub_tf, dynamic.pub_tf, pub_cam):
            wait_subscribed(pub, timeout=30)
        static.sendTransform(transform("map", "odom", 0, (*STATIC_XY, 0.0), quat(STATIC_YAW)))
        broadcast(dynamic, 10 * NS, 11 * NS)
        time.sleep(0.5)

        # Inside the transforms held: a pose at once. 30 ms past the newest (within pose_tolerance_s, so
        # without waiting it would get the 11.00 s pose): it waits for the next transform and is exact.
        a1, a2 = 10 * NS + 520 * MS, 11 * NS + 30 * MS
        pub_cam.publish(image_msg(frame(1), a1))
        pub_cam.publish(image_msg(frame(2), a2))
        time.sleep(0.3)
        broadcast(dynamic, 11 * NS + 50 * MS, 12 * NS)
        client.wait_stats(lambda st: st.frames_ingested == 2 and st.queue_depth == 0, timeout=60)

        # tf stalls: a frame 0.5 s past the newest transform waits, parked, while questions are answered.
        b = 12 * NS + 500 * MS
        pub_cam.publish(image_msg(frame(3), b))
        status.wait(lambda v: v["frames_waiting_for_tf"] == "1", timeout=4.0)
        answer = client.ask("What is there?")
        assert answer.success, answer.message
        assert len(answer.evidence_stamps) == 2  # b is not in the memory yet
        broadcast(dynamic, 12 * NS + 50 * MS, 13 * NS)  # tf comes back, late
        client.wait_stats(lambda st: st.frames_ingested == 3 and st.queue_depth == 0, timeout=60)

        # A frame whose transform never comes: ingested after pose_tf_wait_s without a pose, counted as late.
        c = 30 * NS
        pub_cam.publish(image_msg(frame(4), c))
        client.wait_stats(lambda st: st.frames_ingested == 4 and st.queue_depth == 0, timeout=60)

        resp = client.ask("What is there?")
        assert resp.success, resp.message
        got = {time_to_ns(s): p for s, p in zip(resp.evidence_stamps, resp.evidence_poses)}
        assert sorted(got) == [a1, a2, b, c]
        for s in (a1, a2, b):
            assert_pose(got[s], s)
        assert got[c].header.frame_id == ""

        values = status.wait(lambda v: v["frames_without_pose"] == "1")
        assert (values["frames_with_pose"], values["frames_without_pose_late"]) == ("3", "1"), values
        assert values["frames_waiting_for_tf"] == "0" and int(values["frames_waited_for_tf"]) >= 1, values
        assert values["frames_without_pose_no_transform"] == values["tf_waits_cut_short"] == "0", values
    assert "gets no pose (tf late" in proc.output()


def test_tf_poses_settle_with_the_reason_and_deliver_parked_frames_in_order(ros):
    """The node's tf part alone (ros/tf_poses.py), its buffer filled by hand: what a frame gets after its wait."""
    tf2_module = tf2_ros_module()
    from videokv_node.frame import Frame
    from videokv_node.ingest.pose_history import PoseConfig, PoseCounters
    from videokv_node.ros.tf_poses import TfPoses

    assert tf2_module is not None
    node = Node("tf_poses_unit", context=ros[1])
    delivered, counters = [], PoseCounters()
    config = PoseConfig(pose_source="tf", pose_tf_wait_s=5.0, pose_tolerance_s=0.1)
    tf = TfPoses(node, config, counters, capacity=4, deliver=delivered.append)
    try:
        tf._buffer.set_transform_static(transform("map", "odom", 0, (*STATIC_XY, 0.0), quat(STATIC_YAW)), "test")
        for s in (10 * NS, 11 * NS):
            tf._buffer.set_transform(transform("odom", "base_link", s, *odom_base(s)), "test")
        pose, reason = tf.settle(10 * NS + 250 * MS)
        assert reason == "resolved"
        want_p, want_q = map_base(10 * NS + 250 * MS)
        assert np.allclose(pose.position, want_p, atol=1e-9) and np.allclose(pose.orientation, want_q, atol=1e-9)
        pose, reason = tf.settle(11 * NS + 80 * MS)  # 80 ms past the newest: within pose_tolerance_s
        assert reason == "nearest" and np.allclose(pose.position, map_base(11 * NS)[0], atol=1e-9)
        assert tf.settle(11 * NS + 200 * MS) == (None, "late")
        assert tf.settle(9 * NS) == (None, "too_old")
        assert tf.lookup(11 * NS + 200 * MS) is None  # not yet: uncounted, no reason

        cam = [Frame("/c", s, frame(0)) for s in (11 * NS + 500 * MS, 11 * NS + 600 * MS)]
        tf.submit("/c", cam[0].stamp_ns, cam[0])
        tf.submit("/c", cam[1].stamp_ns, cam[1])
        early = Frame("/d", 10 * NS + 500 * MS, frame(1))
        tf.submit("/d", early.stamp_ns, early)  # another camera, transform there: not held behind /c
        assert [r.item for r in delivered] == [early] and tf.parked == 2
        tf._buffer.set_transform(transform("odom", "base_link", 12 * NS, *odom_base(12 * NS)), "test")
        tf.release()
        assert [r.item for r in delivered] == [early, *cam] and [r.waited for r in delivered] == [False, True, True]
        assert (counters.frames_with_pose, counters.frames_waited, tf.parked) == (3, 2, 0)

        other = TfPoses(node, PoseConfig(pose_source="tf", base_frame="gripper"), PoseCounters(), 4, delivered.append)
        try:
            assert other.settle(10 * NS) == (None, "no_transform")  # gripper is in no tree
        finally:
            other.destroy()
    finally:
        tf.destroy()
        node.destroy_node()


def test_a_sim_time_jump_back_clears_the_tf_buffer_so_a_looping_bag_gets_poses_again(ros):
    """Under use_sim_time a bag loop sets the clock back: transforms of the new lap, older than the
    buffer's newest by more than its cache time, would be refused as old data without the clear."""
    tf2_ros_module()
    from rclpy.parameter import Parameter
    from rclpy.time import Time

    from videokv_node.ingest.pose_history import PoseConfig, PoseCounters
    from videokv_node.ros.tf_poses import TfPoses

    node = Node("tf_poses_sim", context=ros[1], parameter_overrides=[Parameter("use_sim_time", Parameter.Type.BOOL, True)])
    clock = node.get_clock()
    tf = TfPoses(node, PoseConfig(pose_source="tf"), PoseCounters(), capacity=4, deliver=lambda r: None)
    try:
        tf._buffer.set_transform_static(transform("map", "odom", 0, (*STATIC_XY, 0.0), quat(STATIC_YAW)), "test")
        clock.set_ros_time_override(Time(seconds=40))
        for s in (39 * NS, 40 * NS):
            tf._buffer.set_transform(transform("odom", "base_link", s, *odom_base(s)), "test")
        assert tf.lookup(39 * NS + 500 * MS) is not None
        clock.set_ros_time_override(Time(seconds=10))  # the bag starts its next lap
        assert tf.lookup(39 * NS + 500 * MS) is None  # the last lap's transforms are gone
        for s in (10 * NS, 11 * NS):
            tf._buffer.set_transform(transform("odom", "base_link", s, *odom_base(s)), "test")
        pose = tf.lookup(10 * NS + 500 * MS)
        assert pose is not None and np.allclose(pose.position, map_base(10 * NS + 500 * MS)[0], atol=1e-9)
    finally:
        tf.destroy()
        node.destroy_node()
