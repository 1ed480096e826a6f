"""The ``ros`` fixture of the integration tests: one DDS domain and rclpy context per test module.

Each module gets its own ROS_DOMAIN_ID with discovery limited to localhost, so parallel
runs never see each other; rclpy is imported here only when a module asks for it (the
modules skip themselves when ROS 2 is not installed).
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def ros():
    from rclpy.context import Context

    import rclpy
    from videokv_node.programs.launcher import isolated_ros_env

    env = isolated_ros_env()
    env["OMP_NUM_THREADS"] = "1"  # tiny model: threads only contend with this process on 2 cores
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    ctx = Context()
    rclpy.init(context=ctx)
    yield env, ctx
    rclpy.try_shutdown(context=ctx)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
