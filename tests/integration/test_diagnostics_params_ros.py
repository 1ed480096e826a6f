"""/diagnostics thresholds and period changed at run time over real DDS (``ros2 param set``), bad values refused."""

from __future__ import annotations

import time

import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from rclpy.node import Node  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from tests.integration.test_diagnostics_ros import ERROR, OK, level, watching  # noqa: E402
from tests.integration.test_node_ros import NS, RELIABLE, frame, running_node, wait_subscribed  # noqa: E402
from tests.integration.test_runtime_params_ros import Params  # noqa: E402
from videokv_node.programs.synthetic_camera import image_msg  # noqa: E402

CAMERA = "videokv: camera /cam_dp"


def test_diagnostics_thresholds_and_period_are_runtime_parameters(ros):
    params = {
        "model": "tiny",
        "image_topics": ["cam_dp"],
        "camera_qos": "reliable",
        "diagnostics_period_s": 0.2,
        "diagnostics_silence_warn_s": 30.0,
        "diagnostics_silence_error_s": 60.0,
    }
    with running_node(ros, params, "videokv_dp") as (proc, client, peer), watching(peer, ros[1]) as watcher:
        arrivals: list[float] = []
        peer.create_subscription(DiagnosticArray, "/diagnostics", lambda _: arrivals.append(time.monotonic()), 10)
        param_node = Node("videokv_dp_params", context=ros[1])
        node_params = Params(param_node, ros[1], "/videokv_dp")
        try:
            pub = peer.create_publisher(Image, "/cam_dp", RELIABLE)
            wait_subscribed(pub)
            pub.publish(image_msg(frame(1), 10 * NS))
            watcher.wait(CAMERA, lambda s: level(s) == OK and "receiving" in s.message, timeout=30)
            time.sleep(1.5)  # silent for longer than the new thresholds below, not the old ones
            assert level(watcher.latest[CAMERA]) == OK

            # Tightened at run time: the silent camera is ERROR at the next report, no restart.
            assert node_params.set(diagnostics_silence_warn_s=0.5, diagnostics_silence_error_s=1.0) == {
                "diagnostics_silence_warn_s": (True, ""), "diagnostics_silence_error_s": (True, "")}
            status = watcher.wait(CAMERA, lambda s: level(s) == ERROR, timeout=10)
            assert "(> 1.0 s)" in status.message

            # Refused with the reason, nothing changed.
            ok, reason = node_params.set(diagnostics_silence_warn_s=5.0)["diagnostics_silence_warn_s"]
            assert not ok and "diagnostics_silence_warn_s <= diagnostics_silence_error_s" in reason
            ok, reason = node_params.set(diagnostics_drop_warn_ratio=1.0)["diagnostics_drop_warn_ratio"]
            assert not ok and "[0, 1)" in reason
            assert node_params.get("diagnostics_silence_warn_s", "diagnostics_drop_warn_ratio") == {
                "diagnostics_silence_warn_s": 0.5, "diagnostics_drop_warn_ratio": 0.1}

            # The period follows: about 5 reports a second before, about 1 after.
            assert node_params.set(diagnostics_period_s=1.0)["diagnostics_period_s"][0]
            time.sleep(1.5)  # the tick already scheduled at the old period may still come
            start = len(arrivals)
            time.sleep(4.0)
            # 4 at 1 s; 20 at the old 0.2 s. Wide bounds: a loaded CI machine delays ticks and delivers late.
            assert 1 <= len(arrivals) - start <= 10, len(arrivals) - start
            assert proc.alive()
        finally:
            node_params.close()
            param_node.destroy_node()
