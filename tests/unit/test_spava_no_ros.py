"""The Spava package is library code: it imports without ROS (the server imports ros.long_replay lazily, rank 0 only)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.unit.test_library_has_no_ros import PACKAGE_ROOT, SCRIPT

LIBRARY = '("videokv_node.memory", "videokv_node.models", "videokv_node.ingest")'


def test_spava_imports_without_ros():
    assert LIBRARY in SCRIPT, "test_library_has_no_ros.SCRIPT changed: update this test"
    script = SCRIPT.replace(LIBRARY, '("videokv_node.spava",)')
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT))
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    imported = set(result.stdout.split())
    assert {"videokv_node.spava.server", "videokv_node.spava.shard", "videokv_node.spava.worker"} <= imported
