"""The type checker passes: mypy (requirements/test.txt) on the files and settings of ``mypy.ini`` (issue 45).

``NodeHost`` and the node's Optional state are checked, not only written: a surface reading what the
protocol lacks, a node that stops matching it, or a None used unchecked fails here, under `make test`.
Run as `make test` runs it (``. ./env.sh`` first): rclpy's own annotations are read from the ROS wheels.
The cache lives in the system's temporary directory, one per user, so a second run checks only what
changed. Since memory/ is checked too (issue 45 part 6): cold, a fresh --cache-dir, ~8 s on the 2-core
machine under load (torch and transformers skipped, mypy.ini; ~5 s without memory/); warm, ~1.5 s.
"""

from __future__ import annotations

import getpass
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_passes_on_the_configured_packages():
    pytest.importorskip("mypy", reason="mypy is not installed (requirements/test.txt: run `make setup`)")
    cache = Path(tempfile.gettempdir()) / f"videokv-mypy-cache-{getpass.getuser()}"
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "mypy.ini"), "--cache-dir", str(cache)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert run.returncode == 0, f"mypy found type errors (mypy.ini):\n{run.stdout}{run.stderr}"
    assert "Success: no issues found" in run.stdout, run.stdout
