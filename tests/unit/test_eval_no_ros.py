"""The evaluation package imports without ROS: its `--via ros` side lives in videokv_node.programs.replay_target
(the command: videokv_node.programs.evaluate).

The same guarded fresh interpreter as test_library_has_no_ros.py, walking videokv_node.eval.
"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.unit.test_library_has_no_ros import PACKAGE_ROOT, SCRIPT

LIBRARY_PACKAGES = '("videokv_node.memory", "videokv_node.models", "videokv_node.ingest")'


def test_eval_imports_without_ros():
    assert LIBRARY_PACKAGES in SCRIPT  # the guard script still walks packages the way this test rewrites
    script = SCRIPT.replace(LIBRARY_PACKAGES, '("videokv_node.eval",)')
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT))
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    imported = set(result.stdout.split())
    for expected in ("videokv_node.eval.replay", "videokv_node.eval.bag_io",
                     "videokv_node.eval.results", "videokv_node.eval.make_bag", "videokv_node.eval.__main__",
                     "videokv_node.eval.cli", "videokv_node.eval.arguments", "videokv_node.eval.target"):
        assert expected in imported
