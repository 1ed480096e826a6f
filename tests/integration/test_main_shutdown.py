"""``ros/main.py``: a stop that shuts the context down under the executor exits 0; a real failure still raises;
an entity destroyed under the executor's wait set does not end the spin.

rclpy raises RCLError ("the given context is not valid") instead of ExternalShutdownException when
SIGINT lands while the executor builds its wait set (seen once in test_lifecycle_ros under load).
Here the executor is a stand-in whose ``spin_once`` does what that race does, in-process and at once.
"""

from __future__ import annotations

import signal

import pytest

pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

import rclpy  # noqa: E402
from rclpy.exceptions import InvalidHandle  # noqa: E402
from rclpy.executors import ExternalShutdownException  # noqa: E402

from videokv_node.ros import main as main_module  # noqa: E402


class _Node:
    def get_parameter(self, name):  # the executor's size reads max_pending_questions and the camera topics
        return type("P", (), {"value": ["cam"] if name.endswith("_topics") else 1})()

    def destroy_node(self):
        self.destroyed = True


def _executor(error: Exception, shutdown: bool, first: tuple[Exception, ...] = ()):
    """A stand-in executor: its first spins raise ``first``'s errors in turn (entities destroyed under the wait
    set), the next shuts the context down if ``shutdown`` (what the SIGINT handler does) and raises ``error``."""

    class Executor:
        spins = 0

        def __init__(self, num_threads):
            self.context = rclpy.get_default_context()

        def add_node(self, node):
            pass

        def spin_once(self):
            Executor.spins += 1
            if Executor.spins <= len(first):
                raise first[Executor.spins - 1]
            if shutdown:
                rclpy.shutdown()
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


def test_an_entity_destroyed_under_the_wait_set_does_not_end_the_spin(node, monkeypatch):
    """A lifecycle transition destroying an event handler or the action server while the executor adds it to a
    wait set (rclpy raises InvalidHandle or RCLError out of spin_once; seen in CI's lifecycle tests): the node
    spins on, and stops cleanly."""
    races = (InvalidHandle("cannot use Destroyable because destruction was requested"),
             main_module.RCLError("Failed to add 'rcl_action_server_t' to wait set: action server pointer is invalid"),
             InvalidHandle("cannot use Destroyable because destruction was requested"))
    executor = _executor(ExternalShutdownException(), False, races)
    monkeypatch.setattr(main_module, "MultiThreadedExecutor", executor)
    assert main_module.main([]) == 0
    assert executor.spins == 4 and node.destroyed


def test_an_error_that_outlasts_a_race_is_raised(node, monkeypatch):
    persistent = main_module.RCLError("something broke for good")
    executor = _executor(persistent, False, (persistent,) * main_module.RACE_RETRIES)
    monkeypatch.setattr(main_module, "MultiThreadedExecutor", executor)
    with pytest.raises(main_module.RCLError, match="for good"):
        main_module.main([])
    assert executor.spins == main_module.RACE_RETRIES + 1 and node.destroyed


def test_a_signal_shutting_the_context_down_during_main_s_own_shutdown_is_a_clean_stop(node, monkeypatch):
    """rclpy's signal handler shuts the context down from its C thread between ``try_shutdown``'s ``ok()`` and
    its ``shutdown()`` (seen in CI: the lifecycle node exited 1 after a clean stop); here that interleaving is made
    at once by a ``try_shutdown`` that lets the 'signal' in first, then does what rclpy does."""
    monkeypatch.setattr(main_module, "MultiThreadedExecutor", _executor(ExternalShutdownException(), False))

    def try_shutdown_raced(context=None):
        assert rclpy.ok(context=context)  # the check passed ...
        rclpy.shutdown(context=context)  # ... the signal's thread shut it down ...
        raise main_module.RCLError("failed to shutdown: rcl_shutdown already called on the given context")

    with monkeypatch.context() as patch:  # undone before the fixture's own shutdown
        patch.setattr(rclpy, "try_shutdown", try_shutdown_raced)
        assert main_module.main([]) == 0
    assert node.destroyed and not rclpy.ok()


def test_a_shutdown_that_fails_with_the_context_alive_is_raised(node, monkeypatch):
    monkeypatch.setattr(main_module, "MultiThreadedExecutor", _executor(ExternalShutdownException(), False))

    def try_shutdown_broken(context=None):
        raise main_module.RCLError("failed to shutdown: something else")

    with monkeypatch.context() as patch, pytest.raises(main_module.RCLError, match="something else"):
        patch.setattr(rclpy, "try_shutdown", try_shutdown_broken)
        main_module.main([])
    assert rclpy.ok()
