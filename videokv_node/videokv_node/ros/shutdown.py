"""Shutting the ROS context down at a process's end, when a signal may be shutting it down at the same moment.

rclpy's SIGINT/SIGTERM handler shuts the contexts down from its own thread, in C, past the
Python-level lock ``Context.try_shutdown`` takes: when the signal lands between that method's
``ok()`` check and its ``shutdown()``, rclpy raises RCLError ("rcl_shutdown already called on the
given context") although what the caller asked for, a context shut down, holds. Seen in CI: the
lifecycle node exited 1 from its ``finally`` after a clean stop. ``shutdown_context`` treats that as
done and raises anything else.
"""

from __future__ import annotations

import rclpy
from rclpy.context import Context
from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy

RCLError = _rclpy.RCLError  # what rclpy's C layer raises (not exported elsewhere)


def shutdown_context(context: Context | None = None) -> None:
    """Shut ``context`` (the default context if None) down unless it already is; a concurrent shutdown is not an error."""
    try:
        rclpy.try_shutdown(context=context)
    except RCLError:
        if rclpy.ok(context=context):
            raise
