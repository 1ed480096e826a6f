"""A restarted Spava job group meets its new peers, not the dead incarnation's addresses.

torchrun's static rendezvous keeps one TCPStore across ``--max-restarts``; the
service keys its process groups per incarnation (``server.init_job_groups``). Run
as a real torchrun job (``spava_restart_job``) whose restart is timed so that rank 0
reads its peer's key before the new rank 1 writes it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.unit.spava_jobs import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_the_restarted_group_connects_to_its_new_peers():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "tests.unit.spava_restart_job"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "incarnation 1 rank 0 ok" in out and "incarnation 1 rank 1 ok" in out, out[-4000:]
