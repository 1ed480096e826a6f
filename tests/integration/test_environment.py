"""The environment that `make test` builds: ROS 2 wheels, the built workspace, env.sh.

These tests need `. ./env.sh` (the Makefile does it); run alone they fail with a hint
instead of an ImportError deep in rclpy.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _require_env():
    if "videokv_interfaces" not in os.environ.get("AMENT_PREFIX_PATH", ""):
        pytest.fail("ros2_ws is not on AMENT_PREFIX_PATH: run `make build` and `. ./env.sh` first")


def test_rclpy_and_interfaces_import():
    _require_env()
    import rclpy  # noqa: F401
    from videokv_interfaces.msg import MemoryStats
    from videokv_interfaces.srv import AskVideo

    request = AskVideo.Request(question="what is on the table?", options=["a cup", "a book"])
    assert list(request.options) == ["a cup", "a book"]
    assert AskVideo.Response().option_index == 0
    assert MemoryStats().frames_in_memory == 0


def test_env_sh_alone_makes_everything_importable():
    """In a fresh interpreter (no conftest sys.path help), from the source tree."""
    _require_env()
    code = "import rclpy, videokv_interfaces.srv, videokv_node; print(videokv_node.__file__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd="/", timeout=60)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).resolve().is_relative_to(REPO / "videokv_node" / "videokv_node")


def test_installed_share_has_launch_and_config():
    _require_env()
    from ament_index_python.packages import get_package_share_directory

    share = Path(get_package_share_directory("videokv_node"))
    assert share.is_relative_to(REPO / "ros2_ws" / "install" / "videokv_node")
    for rel in ("launch/memory.launch.py", "config/memory.yaml", "package.xml"):
        installed = share / rel
        assert installed.is_file(), f"{installed} missing: is it in the source tree and was ros2_ws rebuilt?"
    # --symlink-install: the installed files are the sources, so an edit needs no rebuild.
    assert (share / "config" / "memory.yaml").read_bytes() == (REPO / "config" / "memory.yaml").read_bytes()
    assert Path(get_package_share_directory("videokv_interfaces")).is_dir()


TALKER = """
import sys, rclpy
from std_msgs.msg import String
rclpy.init()
node = rclpy.create_node("env_talker")
pub = node.create_publisher(String, "env_check", 10)
count = 0
def tick():
    global count
    pub.publish(String(data=f"hello {count}"))
    count += 1
node.create_timer(0.05, tick)
try:
    while rclpy.ok() and count < 400:  # 20 s at most; the test kills it sooner
        rclpy.spin_once(node, timeout_sec=0.1)
finally:
    node.destroy_node()
    rclpy.try_shutdown()
"""

LISTENER = """
import sys, rclpy
from std_msgs.msg import String
rclpy.init()
node = rclpy.create_node("env_listener")
got = []
node.create_subscription(String, "env_check", lambda m: got.append(m.data), 10)
clock = node.get_clock()
deadline = clock.now().nanoseconds + 15_000_000_000
while not got and clock.now().nanoseconds < deadline:
    rclpy.spin_once(node, timeout_sec=0.1)
print(got[0] if got else "NOTHING", flush=True)
node.destroy_node()
rclpy.try_shutdown()
sys.exit(0 if got else 1)
"""


@pytest.mark.timeout(60)
def test_two_processes_talk_over_fast_dds():
    """A publisher and a subscriber in separate processes, on a domain of their own."""
    _require_env()
    env = dict(os.environ)
    env["ROS_DOMAIN_ID"] = str(random.Random().randint(1, 100))
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    env["RMW_IMPLEMENTATION"] = "rmw_fastrtps_cpp"
    talker = subprocess.Popen([sys.executable, "-c", textwrap.dedent(TALKER)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        listener = subprocess.run([sys.executable, "-c", textwrap.dedent(LISTENER)], env=env,
                                  capture_output=True, text=True, timeout=45)
    finally:
        talker.kill()
        talker_out, _ = talker.communicate(timeout=10)
    assert listener.returncode == 0, (
        f"listener heard nothing on domain {env['ROS_DOMAIN_ID']}\n"
        f"listener: {listener.stdout}{listener.stderr}\ntalker: {talker_out}")
    assert listener.stdout.startswith("hello ")
