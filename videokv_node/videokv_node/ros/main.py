"""``videokv_node`` (the console script), ``python -m videokv_node``: start the node the ``lifecycle`` parameter asks for.

The plain node (``ros/node.py``) is configured and active from start to exit; the lifecycle
node (``ros/lifecycle.py``) starts unconfigured. This module is the only one that knows
both, so neither imports the other's module.
"""

from __future__ import annotations

import signal
import sys

import rclpy
from rclpy.exceptions import InvalidHandle, ParameterException
from rclpy.executors import Executor, ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node

from videokv_node.memory.config import ConfigError
from videokv_node.models.factory import ModelLoadError
from videokv_node.ros.lifecycle import VideoKVLifecycleNode
from videokv_node.ros.node import NODE_NAME, VideoKVNode
from videokv_node.ros.shutdown import RCLError, shutdown_context


def wants_lifecycle() -> bool:
    """The ``lifecycle`` parameter (command line or params file), read before the node is made.

    A short-lived node of the same name reads it, so remapping and params files apply
    as to the real node; it has no parameter services and no rosout.
    """
    probe = Node(NODE_NAME, start_parameter_services=False, enable_rosout=False)
    try:
        return bool(probe.declare_parameter("lifecycle", False).value)
    except ParameterException as exc:
        raise ConfigError(str(exc)) from exc
    finally:
        probe.destroy_node()


def make_node() -> Node:
    """The plain node, or the lifecycle node (unconfigured) when the ``lifecycle`` parameter is true."""
    if wants_lifecycle():
        return VideoKVLifecycleNode()
    return VideoKVNode()


def executor_threads(node: Node) -> int:
    """Threads enough that no camera waits for another and questions never wait for a thread.

    One per camera (each has its own callback group, ros/camera_intake.py), one per question
    that may wait on the model (a service callback blocks on its answer), and five for the
    timers, ~/locate, ~/reset, the action's bookkeeping and the memory view's timer (ros/memory_view.py:
    it waits on the model worker for a read of the memory). Read from the declared parameters:
    the lifecycle node may still be unconfigured, its settings not yet read.
    """
    topics = {t for name in ("image_topics", "compressed_topics") for t in node.get_parameter(name).value if t}
    return 5 + node.get_parameter("max_pending_questions").value + len(topics)


RACE_RETRIES = 100  # consecutive failed wait sets before an error is taken as real, not a destruction race


def spin(executor: Executor) -> None:
    """``executor.spin()``, except that an entity destroyed while the executor builds its wait set does not end it.

    A lifecycle transition (deactivate, cleanup) destroys the camera subscriptions, their QoS event
    handlers, the services and the action server on an executor thread while the executor's own thread
    may be adding them to its next wait set. rclpy (Jazzy) guards that for subscriptions, services,
    timers and clients but not for waitables: an event handler raises InvalidHandle ("destruction was
    requested"), the action server RCLError ("action server pointer is invalid") out of ``spin_once``,
    and ``spin`` ends, the node with it. With the node's 0.1 ms GIL switch interval
    (``gil_switch_interval_s``) threads interleave finely enough for that to happen in one deactivate
    in a few (CI's lifecycle tests); the wait set is built again instead, from the entities left. Only
    while the context is valid (a shutdown's errors go to ``main``), and at most ``RACE_RETRIES`` times
    in a row: an error that outlasts that is not a race and is raised.
    """
    failed = 0
    while executor.context.ok():
        try:
            executor.spin_once()
            failed = 0
        except (InvalidHandle, RCLError):
            failed += 1
            if not executor.context.ok() or failed > RACE_RETRIES:
                raise


def main(args=None) -> int:
    """Spin the node on a MultiThreadedExecutor until Ctrl-C or shutdown; 1 if it cannot start."""
    rclpy.init(args=args)
    node = None
    code = 0
    try:
        node = make_node()
        executor = MultiThreadedExecutor(num_threads=executor_threads(node))
        executor.add_node(node)
        spin(executor)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except (ConfigError, ModelLoadError) as exc:
        rclpy.logging.get_logger(NODE_NAME).fatal(f"cannot start: {exc}")
        code = 1
    except Exception:
        # SIGINT/SIGTERM shut the context down under the executor: when that lands while it builds
        # its wait set, rclpy raises RCLError ("the given context is not valid") rather than
        # ExternalShutdownException. That is a requested stop, not a failure; anything else is.
        if rclpy.ok():
            raise
    finally:
        # A second Ctrl-C must not interrupt the cleanup half-way (the worker join is bounded).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if node is not None:
            node.destroy_node()
        shutdown_context()  # SIGINT's handler may be shutting it down this moment (ros/shutdown.py)
    return code


if __name__ == "__main__":
    sys.exit(main())
