"""``ros/main.py``: a stop that shuts the context down under the executor exits 0; a real failure still raises.

rclpy raises RCLError ("the given context is not valid") instead of ExternalShutdownException when
SIGINT lands while the executor builds its wait set (seen once in test_lifecycle_ros under load).
Here the executor is a stand-in whose ``spin`` does what that race does, in-process and at once.
"""

from __future__ import annotations

import signal

import pytest

pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

import rclpy  # noqa: E402

from videokv_node.ros import main as main_module  # noqa: E402


class _Node:
    def get_parameter(self, name):  # the executor's size reads max_pending_questions and the camera topics
        return type("P", (), {"value": ["cam"] if name.endswith("_topics") else 1})()

    def destroy_node(self):
        self.destroyed = True


def _executor(error: Exception, shutdown: bool):
    class Executor:
        def __init__(self, num_threads):
            pass

        def add_node(self, node):
            pass

        def spin(self):
            if shutdown:
                rclpy.shutdown()  # what the SIGINT handler does
            raise error

    return Executor


@pytest.fixture
def node(monkeypatch):
    node = _Node()
    monkeypatch.setattr(main_module, "make_node", lambda: node)
    monkeypatch.setenv("ROS_DOMAIN_ID", "231")
    sigint = signal.getsignal(signal.SIGINT)  # main() ignores SIGINT while it cleans up
    yield node
    signal.signal(signal.SIGINT, sigint)
    rclpy.try_shutdown()


def test_context_shut_down_under_the_executor_is_a_clean_stop(node, monkeypatch):
    monkeypatch.setattr(main_module, "MultiThreadedExecutor", _executor(RuntimeError("the given context is not valid"), True))
    assert main_module.main([]) == 0
    assert node.destroyed


def test_an_error_with_the_context_alive_is_not_swallowed(node, monkeypatch):
    monkeypatch.setattr(main_module, "MultiThreadedExecutor", _executor(RuntimeError("boom"), False))
    with pytest.raises(RuntimeError, match="boom"):
        main_module.main([])
    assert node.destroyed
