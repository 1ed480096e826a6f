"""/diagnostics over real DDS: a camera goes OK, silent (WARN, then ERROR) and OK again without a restart."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from tests.integration.test_node_ros import RELIABLE, frame, running_node, wait_subscribed  # noqa: E402
from videokv_node.programs.synthetic_camera import image_msg  # noqa: E402

NS = 1_000_000_000
CAMERA = "videokv: camera /cam_diag"
OK, WARN, ERROR = (int.from_bytes(x, "little") for x in (DiagnosticStatus.OK, DiagnosticStatus.WARN,
                                                         DiagnosticStatus.ERROR))




class Watcher:
    """Keeps the latest status of each name published on /diagnostics."""

    def __init__(self, node) -> None:
        self.latest: dict[str, DiagnosticStatus] = {}
        self._cond = threading.Condition()
        node.create_subscription(DiagnosticArray, "/diagnostics", self._on_msg, 10)

    def _on_msg(self, msg: DiagnosticArray) -> None:
        with self._cond:
            for s in msg.status:
                self.latest[s.name] = s
            self._cond.notify_all()

    def wait(self, name: str, pred, timeout: float) -> DiagnosticStatus:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not (name in self.latest and pred(self.latest[name])):
                left = deadline - time.monotonic()
                assert left > 0, f"{name}: last status {self.latest.get(name)}"
                self._cond.wait(left)
            return self.latest[name]


@contextmanager
def watching(peer, context):
    """A Watcher on ``peer``, spun on its own thread until the block ends."""
    watcher = Watcher(peer)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(peer)
    threading.Thread(target=executor.spin, daemon=True).start()
    try:
        yield watcher
    finally:
        executor.shutdown()


def level(s: DiagnosticStatus) -> int:
    return int.from_bytes(s.level, "little")


def values(s: DiagnosticStatus) -> dict[str, str]:
    return {kv.key: kv.value for kv in s.values}


def test_camera_silence_and_recovery_on_diagnostics(ros):
    params = {
        "model": "tiny",
        "image_topics": ["cam_diag"],
        "camera_qos": "reliable",
        "camera_qos_depth": 200,  # the node's history holds a burst on a loaded machine
        "sample_fps": 2.0,
        "diagnostics_period_s": 0.2,
        "diagnostics_silence_warn_s": 1.0,
        "diagnostics_silence_error_s": 2.5,
    }
    with running_node(ros, params, "videokv_diag") as (proc, client, peer), watching(peer, ros[1]) as watcher:
        pub = peer.create_publisher(Image, "/cam_diag", RELIABLE)
        wait_subscribed(pub)
        stamp = [10 * NS]

        def stream(seconds: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                pub.publish(image_msg(frame(stamp[0] // NS), stamp[0]))
                stamp[0] += NS // 10
                time.sleep(0.1)

        stream(1.5)
        s = watcher.wait(CAMERA, lambda s: level(s) == OK and float(values(s)["input_rate_hz"]) > 0, 10)
        assert s.hardware_id == "/videokv_diag" and "receiving at" in s.message
        memory = watcher.wait("videokv: memory", lambda s: True, 5)
        v = values(memory)
        assert v["model"] == "tiny" and v["vision_backend"] == "torch:cpu" and v["device_memory"] == "cpu"

        # Silence: WARN past 1 s, ERROR past 2.5 s, with the reason.
        s = watcher.wait(CAMERA, lambda s: level(s) == WARN, 10)
        assert s.message.startswith("silent")
        s = watcher.wait(CAMERA, lambda s: level(s) == ERROR, 10)
        assert s.message.startswith("silent: no frame for")

        # The camera comes back: OK again, same node process.
        stream(0.6)
        s = watcher.wait(CAMERA, lambda s: level(s) == OK, 10)
        assert "receiving at" in s.message and proc.alive()

