"""Run-time parameter changes over real DDS: the node process, this process as camera and ``ros2 param set``.

Accepted changes show in ~/memory_stats and in the sampling; refused ones come
back with a reason and leave parameters and memory as they were.
"""

from __future__ import annotations

import time

import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.parameter import Parameter, parameter_value_to_python  # noqa: E402
from rclpy.parameter_client import AsyncParameterClient  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from tests.integration.test_node_ros import NS, RELIABLE, frame, running_node, wait_subscribed  # noqa: E402
from videokv_node.programs.synthetic_camera import image_msg  # noqa: E402

WINDOW = 32




class Params:
    """``ros2 param get/set`` from this process, spinning the peer node until each reply."""

    def __init__(self, peer, ctx, node_name: str) -> None:
        self.client = AsyncParameterClient(peer, node_name)
        self.executor = SingleThreadedExecutor(context=ctx)
        self.executor.add_node(peer)
        assert self.client.wait_for_services(timeout_sec=30.0), "parameter services not found"

    def _wait(self, future):
        self.executor.spin_until_future_complete(future, timeout_sec=60.0)
        assert future.done(), "no reply from the parameter service"
        return future.result()

    def set(self, **values):
        """Set each parameter (dots as '__'); returns {name: (successful, reason)}."""
        params = [Parameter(name.replace("__", "."), value=value) for name, value in values.items()]
        results = self._wait(self.client.set_parameters(params)).results
        return {p.name: (r.successful, r.reason) for p, r in zip(params, results)}

    def get(self, *names):
        return dict(zip(names, (parameter_value_to_python(v) for v in self._wait(self.client.get_parameters(list(names))).values)))

    def close(self) -> None:
        self.executor.shutdown()


def test_budget_and_sample_fps_change_at_run_time_and_bad_values_are_refused(ros):
    params = {
        "model": "tiny",
        "image_topics": ["cam"],
        "camera_qos": "reliable",
        "camera_qos_depth": 200,  # the node's history holds a burst on a loaded machine
        "sample_fps": 0.0,
        "queue_size": 64,
        "stats_period_s": 0.2,
        "memory.policy": "rekv",
        "memory.budget_tokens": 1024,
        "memory.local_window_tokens": WINDOW,
        "max_new_tokens": 4,
    }
    with running_node(ros, params, "videokv_rt") as (proc, client, cam):
        param = Params(cam, ros[1], "/videokv_rt")
        try:
            sink = client.wait_stats(lambda s: s.frames_in_memory == 0, timeout=60).tokens_resident
            pub = cam.create_publisher(Image, "/cam", RELIABLE)
            wait_subscribed(pub)
            for i in range(10):
                pub.publish(image_msg(frame(i), (10 + i) * NS))
                time.sleep(0.05)
            stats = client.wait_stats(lambda s: s.frames_ingested == 10 and s.queue_depth == 0, timeout=120)
            per_frame = (stats.tokens_resident - sink) // 10
            assert stats.tokens_resident == sink + 10 * per_frame and stats.tokens_offloaded == 0

            # Accepted: a budget of the window plus two frames (the oldest leave the device at once), 1 fps.
            budget = sink + WINDOW + 2 * per_frame
            assert param.set(sample_fps=1.0, memory__budget_tokens=budget) == {
                "sample_fps": (True, ""), "memory.budget_tokens": (True, "")}
            stats = client.wait_stats(lambda s: s.budget_tokens == budget, timeout=30)
            assert stats.tokens_resident <= budget and stats.tokens_offloaded > 0
            assert stats.frames_ingested == 10
            for i in range(8):  # 4 frames a second for 2 s: 1 fps keeps those stamped 20 s and 21 s
                pub.publish(image_msg(frame(20 + i), 20 * NS + i * NS // 4))
                time.sleep(0.05)
            stats = client.wait_stats(lambda s: s.frames_received == 18 and s.queue_depth == 0 and s.frames_ingested >= 12,
                                      timeout=120)
            assert stats.frames_ingested == 12 and stats.tokens_resident <= budget

            # Refused with a reason; nothing changed.
            refused = {
                "memory.budget_tokens": (dict(memory__budget_tokens=sink + WINDOW + per_frame - 1), "must hold the prompt sink"),
                "sample_fps": (dict(sample_fps=2000.0), "tolerance_s"),  # below the 1 ms tolerance
                "sample_tolerance_s": (dict(sample_tolerance_s=-1.0), "sample_tolerance_s"),  # outside the descriptor's range
                "memory.policy": (dict(memory__policy="full"), "read-only"),
                "max_new_tokens": (dict(max_new_tokens=2000), "max_new_tokens must be in"),
            }
            for name, (values, reason) in refused.items():
                ok, why = param.set(**values)[name]
                assert not ok and reason in why, (name, why)
            assert param.get("sample_fps", "sample_tolerance_s", "memory.budget_tokens", "memory.policy", "max_new_tokens") == {
                "sample_fps": 1.0, "sample_tolerance_s": 0.001, "memory.budget_tokens": budget,
                "memory.policy": "rekv", "max_new_tokens": 4}
            after = client.wait_stats(lambda s: True, timeout=10)
            assert (after.budget_tokens, after.policy, after.frames_ingested) == (budget, "rekv", 12)
            assert after.tokens_resident <= budget
            resp = client.ask("What is there?", max_new_tokens=4)
            assert resp.success, resp.message
        finally:
            param.close()
