"""The memory on the map and at a glance over real DDS (issue 46): a node process with odometry and a camera,
``~/memory_markers`` read as a viewer would (adds and deletes applied in order, late-joining: transient local),
``~/answer_markers`` after a ``~/locate``, ``~/memory_sheet`` within its byte cap on request, and a bad value of
the view's parameters refusing the start with the reason."""

from __future__ import annotations

import io
import time

import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")
visualization_msgs = pytest.importorskip("visualization_msgs", reason="visualization_msgs is not installed: run `make build`")

from nav_msgs.msg import Odometry  # noqa: E402
from PIL import Image as PILImage  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import CompressedImage, Image  # noqa: E402
from std_srvs.srv import Trigger  # noqa: E402
from visualization_msgs.msg import Marker, MarkerArray  # noqa: E402

from tests.integration.test_node_ros import frame, running_node, wait_subscribed  # noqa: E402
from tests.integration.test_pose_locate_ros import odom, truth  # noqa: E402
from videokv_node.programs.launcher import NodeProcess  # noqa: E402
from videokv_node.programs.synthetic_camera import image_msg  # noqa: E402
from videokv_node.ros.conversions import time_to_ns  # noqa: E402

NS = 1_000_000_000
RELIABLE = QoSProfile(depth=500, reliability=ReliabilityPolicy.RELIABLE)
LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
SHEET_CAP = 16 << 10


def viewer_state(arrays: list[MarkerArray]) -> dict[tuple[str, int], Marker]:
    """What RViz shows after the arrays, in order: ADD sets, DELETE removes, DELETEALL clears."""
    shown: dict[tuple[str, int], Marker] = {}
    for array in arrays:
        for m in array.markers:
            if m.action == Marker.DELETEALL:
                shown.clear()
            elif m.action == Marker.DELETE:
                shown.pop((m.ns, m.id), None)
            else:
                shown[(m.ns, m.id)] = m
    return shown


def spin_until(executor, done, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        executor.spin_once(timeout_sec=0.1)
    return done()


def test_markers_and_sheet_of_the_memory_over_dds(ros):
    params = {"model": "tiny", "image_topics": ["cam_a"], "camera_qos": "reliable", "camera_qos_depth": 100,
              "sample_fps": 0.0, "stats_period_s": 0.2, "memory.policy": "rekv", "memory.budget_tokens": 1024,
              "memory.local_window_tokens": 32, "memory.retrieve_frames": 8, "max_new_tokens": 2,
              "pose_topic": "odom", "pose_tolerance_s": 0.1, "locate_max_k": 5,
              "markers.rate_hz": 5.0, "markers.max_frames": 4, "markers.max_path_points": 50,
              "sheet.thumbnail_width": 32, "sheet.max_frames": 4, "sheet.columns": 2, "sheet.max_bytes": SHEET_CAP}
    with running_node(ros, params, "videokv_view") as (proc, client, peer):
        pub_odom = peer.create_publisher(Odometry, "/odom", RELIABLE)
        pub_cam = peer.create_publisher(Image, "/cam_a", RELIABLE)
        wait_subscribed(pub_odom, timeout=30)
        wait_subscribed(pub_cam)
        for i in range(61):  # 10 Hz from 10 s to 16 s
            s = 10 * NS + i * NS // 10
            pub_odom.publish(odom(s, *truth(s)))
            time.sleep(0.01)
        time.sleep(1.0)
        stamps = [10 * NS + 500_000_000 + k * NS for k in range(6)]  # 10.5 .. 15.5 s, all inside the poses' span
        for k, s in enumerate(stamps):
            pub_cam.publish(image_msg(frame(k), s))
            time.sleep(0.05)
        client.wait_stats(lambda st: st.frames_ingested == len(stamps) and st.queue_depth == 0, timeout=120)
        where = {round(truth(s)[0], 6): s for s in stamps}  # x of the pose at each frame's stamp

        # Late-joining viewer: transient local gives it the last drawing; the drawing settles once the memory does.
        markers, sheets, answers = [], [], []
        peer.create_subscription(MarkerArray, "/videokv_view/memory_markers", markers.append, LATCHED)
        peer.create_subscription(CompressedImage, "/videokv_view/memory_sheet", sheets.append, LATCHED)
        peer.create_subscription(MarkerArray, "/videokv_view/answer_markers", answers.append, LATCHED)
        executor = SingleThreadedExecutor(context=ros[1])
        executor.add_node(peer)

        def settled():
            shown = viewer_state(markers)
            return len([k for k in shown if k[0] == "videokv/frames"]) == 4
        assert spin_until(executor, settled), proc.output()
        shown = viewer_state(markers)
        assert {m.header.frame_id for m in shown.values()} == {"odom"}
        frames = sorted((m for (ns, _), m in shown.items() if ns == "videokv/frames"), key=lambda m: m.pose.position.x)
        assert len({m.id for m in frames}) == 4 and all(m.type == Marker.SPHERE for m in frames)
        xs = [round(m.pose.position.x, 6) for m in frames]
        assert set(xs) <= set(where) and xs[0] == min(where) and xs[-1] == max(where), xs  # oldest and newest drawn
        for m in frames:
            assert abs(m.pose.position.y + 2 * m.pose.position.x) < 1e-6  # y = -2x on the published trajectory
        path = shown[("videokv/path", 0)]
        assert path.type == Marker.LINE_STRIP and [round(p.x, 6) for p in path.points] == sorted(where)
        assert not [k for k in shown if k[0] == "videokv/words"]  # the tiny model writes no words into frames
        assert len(shown) <= 1 + 2 * 4 + 100
        ids_before = {k for k in shown}

        # The answer on the map: ~/locate's moments by rank, at their poses.
        loc = client.locate("a red box", top_k=3)
        assert loc.success, loc.message
        assert spin_until(executor, lambda: answers), "no ~/answer_markers"
        assert answers[-1].markers[0].action == Marker.DELETEALL
        spots = {m.id: m for m in answers[-1].markers if m.ns == "videokv/answer"}
        assert sorted(spots) == [0, 1, 2]
        for rank, (t, pose) in enumerate(zip(loc.stamps, loc.poses)):
            assert spots[rank].header.frame_id == "odom" and spots[rank].pose.position.x == pytest.approx(pose.pose.position.x)
            assert round(spots[rank].pose.position.x, 6) in where and where[round(spots[rank].pose.position.x, 6)] == time_to_ns(t)

        # The sheet, on request, within its cap; the memory unchanged meanwhile keeps the markers' ids.
        trigger = peer.create_client(Trigger, "/videokv_view/publish_memory_sheet")
        assert trigger.wait_for_service(timeout_sec=30)
        count = len(sheets)
        future = trigger.call_async(Trigger.Request())
        assert spin_until(executor, lambda: future.done() and len(sheets) > count)
        assert future.result().success, future.result().message
        sheet = sheets[-1]
        assert sheet.format == "jpeg" and 0 < len(sheet.data) <= SHEET_CAP
        image = PILImage.open(io.BytesIO(bytes(sheet.data)))
        assert image.format == "JPEG" and image.width == 2 * (32 + 4)  # two columns of 32 px thumbnails
        assert {k for k in viewer_state(markers)} == ids_before
        executor.remove_node(peer)


@pytest.mark.parametrize("params, reason", [
    ({"markers.rate_hz": 50.0}, "markers.rate_hz must be in (0, 10]"),
    ({"sheet.max_bytes": 1000}, "sheet.max_bytes must be >= 16384"),
])
def test_bad_view_parameters_stop_the_node_with_the_reason(ros, params, reason):
    env, _ = ros
    proc = NodeProcess({"model": "tiny", **params}, env, node_name="videokv_bad_view")
    try:
        proc.proc.wait(timeout=120)
    finally:
        code = proc.stop()
    out = proc.output()
    assert code == 1, out
    assert "cannot start" in out and reason in out, out
