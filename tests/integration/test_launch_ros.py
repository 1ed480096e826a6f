"""launch/memory.launch.py through the real `ros2 launch`, driven with the `ros2` verbs a robot user types.

The tools are the pure-Python launch, launch_ros and ros2cli of ../shared/ros2tools, assembled
into .ros2tools by scripts/setup_ros2tools.sh (`make build`); without them these tests skip with
that reason. Each test starts `ros2 launch` in its own process group and DDS domain, talks to the
node only through `ros2 ...` commands (no rclpy in this process), and stops the launch with
SIGINT, as a user's Ctrl-C: the node must finish cleanly, with no error on the way out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from videokv_node.programs.launcher import isolated_ros_env

ROOT = Path(__file__).resolve().parents[2]
TOOLS_ENV = ROOT / ".ros2tools" / "env.sh"
SHARED_TOOLS = ROOT.parent / "shared" / "ros2tools" / "setup.sh"


def missing_tools() -> str:
    """Why the real ros2 CLI is not there, and how to get it ('' when it is)."""
    if TOOLS_ENV.is_file():
        return ""
    if not SHARED_TOOLS.is_file():
        return (f"the real ros2 CLI is not assembled ({TOOLS_ENV} missing) and cannot be: {SHARED_TOOLS} is "
                "absent (../shared/ros2tools next to the checkout holds the pure-Python launch, launch_ros, ros2cli)")
    return (f"the real ros2 CLI is not assembled: {TOOLS_ENV} is missing; run `make build` "
            f"(scripts/setup_ros2tools.sh assembles it from {SHARED_TOOLS.parent})")


pytestmark = pytest.mark.skipif(bool(missing_tools()), reason=missing_tools() or "unused")


@pytest.fixture(scope="module")
def ros2_env():
    """The environment a user has after `. ./env.sh && . .ros2tools/env.sh`, in a DDS domain of its own."""
    dump = subprocess.run(["bash", "-c", f". ./env.sh >/dev/null && . {TOOLS_ENV} && env -0"], cwd=ROOT,
                          capture_output=True, check=True).stdout
    env = dict(item.split("=", 1) for item in dump.decode().split("\0") if "=" in item)
    base = isolated_ros_env()
    env.update({k: base[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE", "PYTHONUNBUFFERED")})
    env["OMP_NUM_THREADS"] = "1"
    return env


# Verbs that look the node up in the graph first: run without the ros2 daemon (it would outlive the
# test), spinning a few seconds for discovery, and retried while the node is not yet discovered.
_GRAPH_VERBS = {("param", "get"), ("param", "set"), ("param", "dump"), ("lifecycle", "get"), ("lifecycle", "set")}


def ros2(env, *args: str, timeout: float = 90.0) -> subprocess.CompletedProcess:
    cmd = ["ros2", *args]
    if tuple(args[:2]) in _GRAPH_VERBS:
        cmd[3:3] = ["--no-daemon", "--spin-time", "3"]
    deadline = time.monotonic() + timeout
    while True:
        got = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        if "Node not found" not in got.stderr + got.stdout or time.monotonic() > deadline:
            return got
        time.sleep(1.0)


class Launch:
    """`ros2 launch videokv_node memory.launch.py ARGS` in its own process group, output to a file."""

    def __init__(self, env, tmp_path: Path, *args: str) -> None:
        self.log = tmp_path / "launch.log"
        self._out = open(self.log, "w")
        self.proc = subprocess.Popen(["ros2", "launch", "videokv_node", "memory.launch.py", *args], env=env, cwd=ROOT,
                                     stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text()

    def wait_for(self, text: str, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output():
            assert self.proc.poll() is None, f"ros2 launch exited before {text!r}:\n{self.output()}"
            assert time.monotonic() < deadline, f"no {text!r} after {timeout} s:\n{self.output()}"
            time.sleep(0.25)

    def kill(self) -> None:
        """SIGKILL to the launch and everything it started (one process group), as a power loss would."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        self._out.close()

    def stop(self) -> str:
        """Ctrl-C to the launch, as a user does; returns the whole output once everything exited."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._out.close()
        return self.output()


def assert_clean_exit(out: str) -> None:
    assert "process has finished cleanly" in out, out
    for bad in ("Traceback", "Failed to publish log message to rosout", "[ERROR]", "PackageNotFoundError"):
        assert bad not in out, out


def test_default_arguments_start_the_real_model_and_answer(ros2_env, tmp_path):
    launch = Launch(ros2_env, tmp_path)
    try:
        launch.wait_for("active: ingesting frames and answering questions")
        got = ros2(ros2_env, "param", "get", "/videokv", "model")
        assert got.returncode == 0 and "videokv-tiny" in got.stdout, got
        got = ros2(ros2_env, "param", "get", "/videokv", "image_topics")  # declared with its value, not "not set"
        assert "['image']" in got.stdout, got
        dump = ros2(ros2_env, "param", "dump", "/videokv")
        assert dump.returncode == 0, dump
        params = yaml.safe_load(dump.stdout)["/videokv"]["ros__parameters"]
        assert params["compressed_topics"] == [""] and params["memory"]["mukv"]["granularities"] == ["patch", "frame", "segment"]
        got = ros2(ros2_env, "service", "call", "/videokv/ask", "videokv_interfaces/srv/AskVideo", "{question: 'What did you see?'}")
        assert "success=False" in got.stdout and "no frames in memory" in got.stdout, got  # nothing seen yet: refused, with the reason
    finally:
        out = launch.stop()
    assert_clean_exit(out)


def dumped(env, node: str) -> dict:
    """`ros2 param dump NODE`: the node's parameters, nested as in a params file."""
    dump = ros2(env, "param", "dump", node)
    assert dump.returncode == 0, dump
    return yaml.safe_load(dump.stdout)[node]["ros__parameters"]


def test_a_params_file_alone_decides_every_parameter_a_launch_argument_could_set(ros2_env, tmp_path):
    """No launch argument but params_file: what the file sets stands (the launch defaults used to be
    passed after it: model and policy came back as videokv-tiny and rekv), what it does not set is
    the node's default, and its `lifecycle: true` makes a managed node, unconfigured."""
    params = tmp_path / "robot.yaml"
    params.write_text(yaml.safe_dump({"/**": {"ros__parameters": {
        "model": "tiny", "lifecycle": True, "image_topics": ["/file/cam"],
        "memory": {"policy": "hermes", "question_stage": "tgvkv"}}}}))
    launch = Launch(ros2_env, tmp_path, f"params_file:={params}")
    try:
        deadline = time.monotonic() + 120
        while "unconfigured" not in (state := ros2(ros2_env, "lifecycle", "get", "/videokv")).stdout:
            assert time.monotonic() < deadline, f"{state}\n{launch.output()}"
            time.sleep(1)
        got = dumped(ros2_env, "/videokv")
        # From the file:
        assert (got["model"], got["lifecycle"], got["image_topics"]) == ("tiny", True, ["/file/cam"])
        assert (got["memory"]["policy"], got["memory"]["question_stage"]) == ("hermes", "tgvkv")
        # Set by neither: the node's defaults.
        assert (got["pose_topic"], got["use_sim_time"]) == ("", False)
        assert (got["memory"]["snapshot_dir"], got["memory"]["snapshot_period_s"], got["memory"]["restore_on_start"]) == ("", 0.0, "")
    finally:
        out = launch.stop()
    assert_clean_exit(out)


def test_every_launch_argument_given_wins_over_the_params_file(ros2_env, tmp_path):
    """A params file setting every parameter a launch argument sets, each argument given otherwise:
    the arguments win (lifecycle:=false over the file's true: the plain node, active), in a namespace;
    then param set and the snapshot services work as usual."""
    params = tmp_path / "robot.yaml"
    params.write_text(yaml.safe_dump({"/**": {"ros__parameters": {
        "model": "videokv-tiny", "lifecycle": True, "use_sim_time": True, "pose_topic": "/file/odom",
        "image_topics": ["/file/cam"], "memory": {"policy": "hermes", "question_stage": "tgvkv",
                                                  "snapshot_dir": str(tmp_path / "file_snaps"), "snapshot_period_s": 30.0}}}}))
    mem = tmp_path / "snaps"
    launch = Launch(ros2_env, tmp_path, f"params_file:={params}", "namespace:=robot1", "model:=tiny", "policy:=mukv",
                    "question_stage:=none", "image_topic:=/cam/image", "pose_topic:=/odom", "use_sim_time:=false",
                    "lifecycle:=false", f"memory_dir:={mem}", "snapshot_period_s:=1000.0")
    try:
        launch.wait_for("active: ingesting frames and answering questions")
        assert "[robot1.videokv]" in launch.output()
        got = dumped(ros2_env, "/robot1/videokv")
        assert (got["model"], got["lifecycle"], got["use_sim_time"], got["pose_topic"], got["image_topics"]) == (
            "tiny", False, False, "/odom", ["/cam/image"])
        assert (got["memory"]["policy"], got["memory"]["question_stage"]) == ("mukv", "none")
        assert (got["memory"]["snapshot_dir"], got["memory"]["snapshot_period_s"], got["memory"]["restore_on_start"]) == (
            str(mem), 1000.0, "latest")
        bad = ros2(ros2_env, "param", "set", "/robot1/videokv", "memory.budget_tokens", "5")
        said = bad.stdout + bad.stderr
        assert "Setting parameter failed" in said and "must be smaller than memory.budget_tokens (5)" in said, bad
        ok = ros2(ros2_env, "param", "set", "/robot1/videokv", "memory.budget_tokens", "8192")
        assert "Set parameter successful" in ok.stdout, ok
        assert "8192" in ros2(ros2_env, "param", "get", "/robot1/videokv", "memory.budget_tokens").stdout
        saved = ros2(ros2_env, "service", "call", "/robot1/videokv/save_memory", "videokv_interfaces/srv/SaveMemory", "{name: 'x'}")
        assert "success=True" in saved.stdout, saved
        assert (mem / "x" / "manifest.json").is_file()
    finally:
        out = launch.stop()
    assert_clean_exit(out)


def test_lifecycle_launch_driven_by_ros2_lifecycle_and_an_action_goal(ros2_env, tmp_path):
    launch = Launch(ros2_env, tmp_path, "lifecycle:=true", "model:=tiny")
    try:
        deadline = time.monotonic() + 120
        while "unconfigured" not in (state := ros2(ros2_env, "lifecycle", "get", "/videokv")).stdout:
            assert time.monotonic() < deadline, f"{state}\n{launch.output()}"
            time.sleep(1)
        for transition in ("configure", "activate"):
            got = ros2(ros2_env, "lifecycle", "set", "/videokv", transition, timeout=180)
            assert "Transitioning successful" in got.stdout, f"{got}\n{launch.output()}"
        assert "active" in ros2(ros2_env, "lifecycle", "get", "/videokv").stdout
        goal = ros2(ros2_env, "action", "send_goal", "/videokv/ask", "videokv_interfaces/action/AskVideo",
                    "{question: 'What did you see?'}", timeout=120)
        assert "Goal accepted" in goal.stdout and "no frames in memory" in goal.stdout, goal
        got = ros2(ros2_env, "lifecycle", "set", "/videokv", "deactivate", timeout=120)
        assert "Transitioning successful" in got.stdout, got
    finally:
        out = launch.stop()
    assert_clean_exit(out)


def test_memory_dir_snapshots_survive_a_killed_launch(ros2_env, tmp_path):
    """memory_dir:= turns on periodic snapshots and restore-at-start: SIGKILL to the whole launch (power
    loss), then the same command again restores the newest snapshot."""
    mem = tmp_path / "mem"
    args = ("model:=tiny", f"memory_dir:={mem}", "snapshot_period_s:=1.0")
    first = Launch(ros2_env, tmp_path, *args)
    try:
        first.wait_for("active: ingesting frames and answering questions")
        assert f"String value is: {mem}" in ros2(ros2_env, "param", "get", "/videokv", "memory.snapshot_dir").stdout
        assert "latest" in ros2(ros2_env, "param", "get", "/videokv", "memory.restore_on_start").stdout
        deadline = time.monotonic() + 120
        while not list(mem.glob("auto-*/manifest.json")):
            assert time.monotonic() < deadline, f"no periodic snapshot in {mem}:\n{first.output()}"
            time.sleep(0.5)
    finally:
        first.kill()  # no clean shutdown: no snapshot on the way out
    (tmp_path / "again").mkdir()
    second = Launch(ros2_env, tmp_path / "again", *args)
    try:
        second.wait_for("active: ingesting frames and answering questions")
        assert f"memory restored from {mem}/auto-" in second.output(), second.output()
    finally:
        out = second.stop()
    assert_clean_exit(out)
