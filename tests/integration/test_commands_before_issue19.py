"""Commands that moved keep a way to them: ``python -m videokv_node.eval ... --via ros`` hands over to
``python -m videokv_node.programs.evaluate``, and ``-m videokv_node.spava.server`` (a command before issue 19,
now a library module that imports no command) names the service's command instead of running it. Run as a
user would (a subprocess), asking for the help of the command reached, which names it.
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
    assert "usage: python -m videokv_node.programs.evaluate" in ros.stdout
    engine = run("videokv_node.eval", "--help")
    assert engine.returncode == 0 and "usage: python -m videokv_node.eval" in engine.stdout


def test_spava_server_module_names_the_service_command():
    out = run("videokv_node.spava.server", "--help")
    assert out.returncode != 0 and "-m videokv_node.programs.long_replay" in out.stderr
    service = run("videokv_node.programs.long_replay", "--help")
    assert service.returncode == 0, service.stderr
    assert "usage: torchrun ... -m videokv_node.programs.long_replay" in service.stdout
