"""Start the videokv node as a separate process with an isolated DDS domain (demo, tests, evaluation)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml


_last_domain: dict[tuple[int, int], int] = {}


def next_domain_id() -> int:
    """A ROS_DOMAIN_ID from VIDEOKV_DOMAIN_IDS ("LO-HI", default 1-100).

    The range keeps concurrent test runs of several checkouts apart (and the test suite's
    parallel workers, each given a slice of it by tests/conftest.py). A process's first call
    starts at random in the range; each later call takes the next id, wrapping, so one process
    never reuses a domain (where a killed node of an earlier test may linger in discovery)
    before the whole range has gone round.
    """
    lo_s, _, hi_s = os.environ.get("VIDEOKV_DOMAIN_IDS", "1-100").partition("-")
    lo, hi = int(lo_s), int(hi_s)
    last = _last_domain.get((lo, hi))
    if last is None:
        domain_id = random.Random(os.getpid() ^ int.from_bytes(os.urandom(2), "little")).randint(lo, hi)
    else:
        domain_id = lo + (last - lo + 1) % (hi - lo + 1)
    _last_domain[(lo, hi)] = domain_id
    return domain_id


def isolated_ros_env(domain_id: int | None = None) -> dict[str, str]:
    """The current environment with its own ROS_DOMAIN_ID and discovery kept on localhost."""
    env = dict(os.environ)
    if domain_id is None:
        domain_id = next_domain_id()
    env["ROS_DOMAIN_ID"] = str(domain_id)
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    env.setdefault("RMW_IMPLEMENTATION", "rmw_fastrtps_cpp")
    env["PYTHONUNBUFFERED"] = "1"
    return env


class NodeProcess:
    """``python -m videokv_node`` with the given parameters, written to a params file.

    Stop with ``stop()`` (SIGINT, then SIGKILL after ``timeout``); its output goes to ``log_path``.
    """

    def __init__(self, params: dict, env: dict[str, str], log_path: str | Path | None = None, node_name: str = "videokv"):
        self._tmp = tempfile.TemporaryDirectory(prefix="videokv-")
        params_file = Path(self._tmp.name) / "params.yaml"
        params_file.write_text(yaml.safe_dump({node_name: {"ros__parameters": params}}))
        self.log_path = Path(log_path) if log_path else Path(self._tmp.name) / "node.log"
        self._log = open(self.log_path, "w")
        cmd = [sys.executable, "-m", "videokv_node", "--ros-args", "-r", f"__node:={node_name}", "--params-file", str(params_file)]
        self.proc = subprocess.Popen(cmd, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def kill(self) -> int:
        """SIGKILL: the node gets no chance to clean up (a crash or power loss, for tests)."""
        if self.alive():
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def stop(self, timeout: float = 20.0) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode
