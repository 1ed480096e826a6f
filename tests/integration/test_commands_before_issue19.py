"""The commands documented before issue 19 moved their ROS halves under ros/ still run those halves.

``python -m videokv_node.eval ... --via ros`` hands over to ``python -m videokv_node.ros.evaluate`` and
``torchrun ... -m videokv_node.spava.server`` to ``-m videokv_node.ros.long_replay``: run as a user would
(a subprocess), asking for the help of the command reached, which names it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from videokv_node.eval.__main__ import wants_ros  # noqa: E402


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv, expected", [
    (["bag", "q.json", "--via", "ros"], True), (["--via=ros"], True), (["--via", "engine"], False),
    (["ros"], False), (["--via"], False), ([], False), (["--out", "ros", "--via", "engine"], False),
])
def test_wants_ros(argv, expected):
    assert wants_ros(argv) is expected


def test_eval_via_ros_reaches_the_ros_command():
    ros = run("videokv_node.eval", "--via", "ros", "--help")
    assert ros.returncode == 0, ros.stderr
    assert "usage: python -m videokv_node.ros.evaluate" in ros.stdout
    engine = run("videokv_node.eval", "--help")
    assert engine.returncode == 0 and "usage: python -m videokv_node.eval" in engine.stdout


def test_spava_server_module_reaches_the_service_command():
    out = run("videokv_node.spava.server", "--help")
    assert out.returncode == 0, out.stderr
    assert "usage: torchrun ... -m videokv_node.ros.long_replay" in out.stdout
