"""The lifecycle node over real DDS: transitions driven through lifecycle_msgs ChangeState/GetState.

A separate node process started with ``lifecycle: true``; this process is the
lifecycle manager, the camera, the planner and ``ros2 param set``.
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from lifecycle_msgs.msg import State, Transition  # noqa: E402
from lifecycle_msgs.srv import ChangeState, GetState  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.node import Node  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from tests.integration.test_node_ros import NS, RELIABLE, frame, wait_subscribed  # noqa: E402
from tests.integration.test_runtime_params_ros import Params  # noqa: E402
from videokv_node.programs.client import MemoryClient  # noqa: E402
from videokv_node.programs.launcher import NodeProcess  # noqa: E402
from videokv_node.programs.synthetic_camera import image_msg  # noqa: E402

PARAMS = {
    "lifecycle": True,
    "model": "tiny",
    "image_topics": ["cam_l"],
    "camera_qos": "reliable",
    "camera_qos_depth": 200,
    "sample_fps": 0.0,
    "queue_size": 64,
    "stats_period_s": 0.2,
    "memory.policy": "rekv",
    "memory.budget_tokens": 1024,
    "memory.local_window_tokens": 32,
    "memory.retrieve_frames": 2,
    "max_new_tokens": 3,
}
ABSENT_S = 3.0  # how long a service or subscription must stay undiscovered to count as absent


class Manager:
    """ChangeState / GetState on ``<node>/change_state`` and ``<node>/get_state``, as a lifecycle manager calls them."""

    def __init__(self, ctx, node_name: str) -> None:
        self.node = Node(f"{node_name.strip('/')}_manager", context=ctx)
        self._change = self.node.create_client(ChangeState, f"{node_name}/change_state")
        self._get = self.node.create_client(GetState, f"{node_name}/get_state")
        self._executor = SingleThreadedExecutor(context=ctx)
        self._executor.add_node(self.node)

    def wait_ready(self, timeout: float = 120.0) -> bool:
        """Both services discovered, and a GetState answered. Why the round trip: a service is
        "available" once its request reader matched this client, but its reply can still be lost
        while the node's reply writer has not matched this client's reader; the node then logs
        "failed to send response (timeout)" and a first ChangeState, which must not be re-sent,
        got no reply (seen once on a loaded 2-core CI run). GetState is idempotent, so it is
        re-sent until one comes back; by then discovery between the two processes is done."""
        if not (self._change.wait_for_service(timeout_sec=timeout) and self._get.wait_for_service(timeout_sec=timeout)):
            return False
        for _ in range(max(1, int(timeout // 5))):
            future = self._get.call_async(GetState.Request())
            self._executor.spin_until_future_complete(future, timeout_sec=5.0)
            if future.done():
                return True
        return False

    def _call(self, client, request, timeout: float = 120.0):
        future = client.call_async(request)
        self._executor.spin_until_future_complete(future, timeout_sec=timeout)
        assert future.done(), f"no reply from {client.srv_name}"
        return future.result()

    def state(self) -> int:
        return self._call(self._get, GetState.Request()).current_state.id

    def change(self, transition: int) -> bool:
        request = ChangeState.Request()
        request.transition.id = transition
        return self._call(self._change, request).success

    def close(self) -> None:
        self._executor.shutdown()
        self.node.destroy_node()


@contextmanager
def lifecycle_node(ros, params: dict, name: str):
    """The node process, its manager, a memory client and a peer for publishers; the node must exit cleanly."""
    env, ctx = ros
    proc = NodeProcess(params, env, node_name=name)
    manager = Manager(ctx, f"/{name}")
    client = MemoryClient(node_name=f"/{name}", context=ctx, client_name=f"{name}_client")
    peer = Node(f"{name}_peer", context=ctx)
    try:
        if not manager.wait_ready(timeout=120):
            pytest.fail("lifecycle services did not come up:\n" + proc.output())
        yield proc, manager, client, peer
    finally:
        peer.destroy_node()
        client.close()
        manager.close()
        code = proc.stop()
        print(proc.output()[-4000:])  # shown by pytest when the test fails
    assert code == 0, proc.output()


def stays_absent(present, seconds: float = ABSENT_S) -> bool:
    """True if ``present()`` stays false for ``seconds`` (discovery has had time to find it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if present():
            return False
        time.sleep(0.1)
    return True


def goes_away(present, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while present():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def wait_log(proc, pattern: str, timeout: float = 30.0) -> re.Match:
    deadline = time.monotonic() + timeout
    while not (m := re.search(pattern, proc.output())):
        assert time.monotonic() < deadline, f"no log line matching {pattern!r}:\n{proc.output()[-3000:]}"
        time.sleep(0.1)
    return m


def publish(pub, seeds, start_s: int) -> None:
    for i, seed in enumerate(seeds):
        pub.publish(image_msg(frame(seed), (start_s + i) * NS))
        time.sleep(0.05)


def test_transitions_start_and_stop_work_and_deactivate_frees_the_memory(ros):
    with lifecycle_node(ros, PARAMS, "videokv_lc") as (proc, manager, client, peer):
        pub = peer.create_publisher(Image, "/cam_l", RELIABLE)
        ask_ready = client._ask.service_is_ready
        # Unconfigured: no model loaded, no camera subscribed, no service answering.
        assert manager.state() == State.PRIMARY_STATE_UNCONFIGURED
        assert stays_absent(lambda: ask_ready() or pub.get_subscription_count() > 0)
        assert "loading model" not in proc.output()

        # Configured (inactive): the model is loaded, still nothing in or out.
        assert manager.change(Transition.TRANSITION_CONFIGURE), proc.output()
        assert manager.state() == State.PRIMARY_STATE_INACTIVE
        assert "configured: policy rekv" in proc.output()
        assert stays_absent(lambda: ask_ready() or pub.get_subscription_count() > 0)

        # Active: frames go in, questions are answered.
        assert manager.change(Transition.TRANSITION_ACTIVATE), proc.output()
        assert manager.state() == State.PRIMARY_STATE_ACTIVE
        assert client.wait_ready(timeout=30)
        wait_subscribed(pub)
        publish(pub, range(4), start_s=10)
        stats = client.wait_stats(lambda s: s.frames_ingested == 4 and s.queue_depth == 0, timeout=60)
        assert stats.frames_in_memory == 4 and stats.bytes_resident > 0
        resident = stats.bytes_resident
        answer = client.ask("What is there?")
        assert answer.success, answer.message

        # Deactivated: subscriptions and services gone, memory parked and its device memory freed.
        assert manager.change(Transition.TRANSITION_DEACTIVATE), proc.output()
        assert manager.state() == State.PRIMARY_STATE_INACTIVE
        freed = wait_log(proc, r"freed KV resident on cpu (\d+) -> 0 bytes, host arena (\d+) -> 0 bytes used \(of (\d+) -> 0 reserved")
        # The figures ~/memory_stats showed while active.
        assert (int(freed.group(1)), int(freed.group(2)), int(freed.group(3))) == (
            resident, stats.bytes_offloaded, stats.budget_offload_bytes)
        parked = Path(wait_log(proc, r"memory parked on host disk \(4 blocks, \d+ bytes in (\S+)\)").group(1))
        assert parked.is_dir()
        assert goes_away(lambda: pub.get_subscription_count() > 0)
        assert goes_away(ask_ready)
        publish(pub, range(10, 13), start_s=20)  # nobody listens: never ingested (checked below)
        assert proc.alive()

        # Reactivated: the same memory back, work resumes.
        assert manager.change(Transition.TRANSITION_ACTIVATE), proc.output()
        assert client.wait_ready(timeout=30)
        wait_log(proc, r"memory restored from parking: 4 blocks")
        assert not parked.exists(), "the parked copy outlived its restore"
        stats = client.wait_stats(lambda s: s.frames_in_memory == 4, timeout=30)
        assert stats.frames_ingested == 4 and stats.bytes_resident == resident
        wait_subscribed(pub)
        publish(pub, range(20, 22), start_s=30)
        stats = client.wait_stats(lambda s: s.frames_ingested == 6 and s.queue_depth == 0, timeout=60)
        assert stats.frames_in_memory == 6 and stats.frames_received == 6  # the inactive-time frames never arrived
        again = client.ask("What is there?")
        assert again.success, again.message

        # Cleanup releases memory and model; shutdown finalizes; the process exits cleanly on SIGINT.
        assert manager.change(Transition.TRANSITION_DEACTIVATE)
        parked = Path(re.findall(r"memory parked on host disk \(6 blocks, \d+ bytes in (\S+)\)", proc.output())[-1])
        assert parked.is_dir()
        assert manager.change(Transition.TRANSITION_CLEANUP), proc.output()
        assert manager.state() == State.PRIMARY_STATE_UNCONFIGURED
        wait_log(proc, "memory and model released")
        assert not parked.parent.exists(), "cleanup left the parked memory behind"
        assert manager.change(Transition.TRANSITION_UNCONFIGURED_SHUTDOWN)
        assert manager.state() == State.PRIMARY_STATE_FINALIZED
        assert proc.alive()


def test_bad_configuration_fails_configure_with_the_reason_and_can_be_fixed(ros):
    # No camera (refused before the model loads), and a budget above the local window that cannot
    # hold the prompt sink (refused once the model is loaded).
    params = dict(PARAMS, image_topics=[""], **{"memory.budget_tokens": 40})
    with lifecycle_node(ros, params, "videokv_lc_bad") as (proc, manager, client, peer):
        assert not manager.change(Transition.TRANSITION_CONFIGURE)
        assert manager.state() == State.PRIMARY_STATE_UNCONFIGURED
        wait_log(proc, r"configure failed, still unconfigured: image_topics and compressed_topics are both empty")
        assert proc.alive()

        param_peer = Node("videokv_lc_bad_params", context=ros[1])
        params_client = Params(param_peer, ros[1], "/videokv_lc_bad")
        try:
            # Unconfigured: a parameter that needs a restart on the plain node may be set.
            assert params_client.set(image_topics=["cam_fixed"]) == {"image_topics": (True, "")}
            assert not manager.change(Transition.TRANSITION_CONFIGURE)  # the model loads, the budget does not hold
            wait_log(proc, r"configure failed, still unconfigured: memory.budget_tokens \(40\) must hold the prompt sink")
            assert manager.state() == State.PRIMARY_STATE_UNCONFIGURED
            assert params_client.set(memory__budget_tokens=1024)["memory.budget_tokens"][0]
            assert manager.change(Transition.TRANSITION_CONFIGURE), proc.output()
            assert manager.state() == State.PRIMARY_STATE_INACTIVE
            # Configured: back to read-only, with the reason.
            ok, reason = params_client.set(image_topics=["cam_other"])["image_topics"]
            assert not ok and "cleanup" in reason
            assert params_client.get("image_topics") == {"image_topics": ["cam_fixed"]}
            assert manager.change(Transition.TRANSITION_ACTIVATE)
            pub = peer.create_publisher(Image, "/cam_fixed", RELIABLE)
            wait_subscribed(pub)
            # Shutdown straight from active releases everything.
            assert manager.change(Transition.TRANSITION_ACTIVE_SHUTDOWN), proc.output()
            assert manager.state() == State.PRIMARY_STATE_FINALIZED
            wait_log(proc, "memory and model released")
            assert goes_away(lambda: pub.get_subscription_count() > 0)
        finally:
            params_client.close()
            param_peer.destroy_node()
