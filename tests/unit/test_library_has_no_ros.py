"""The design rule that the library never imports ROS: memory, models, ingest and synthetic
import in a fresh interpreter where any ROS import fails.

A subprocess, so nothing already imported by other tests (or a sourced ROS
environment) can hide an import; a meta-path finder refuses rclpy, rosidl*,
sensor_msgs, std_msgs, geometry_msgs, nav_msgs and builtin_interfaces before any other finder is asked.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parents[2] / "videokv_node"  # holds the videokv_node package

SCRIPT = textwrap.dedent(
    """
    import importlib, importlib.abc, pkgutil, sys

    BLOCKED = ("rclpy", "sensor_msgs", "std_msgs", "geometry_msgs", "nav_msgs", "tf2_ros", "builtin_interfaces")

    class NoRos(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            top = name.partition(".")[0]
            if top in BLOCKED or top.startswith("rosidl"):
                raise ImportError(f"the library must not import ROS: {name}")
            return None

    sys.meta_path.insert(0, NoRos())

    names = ["videokv_node.synthetic", "videokv_node.pose"]
    for pkg_name in ("videokv_node.memory", "videokv_node.models", "videokv_node.ingest"):
        pkg = importlib.import_module(pkg_name)
        names.append(pkg_name)
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg_name + ".")]
    for name in names:
        importlib.import_module(name)
    leaked = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED or m.startswith("rosidl"))
    assert not leaked, leaked
    print("\\n".join(names))
    """
)


def test_library_imports_without_ros():
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_ROOT))
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    imported = set(result.stdout.split())
    for expected in (
        "videokv_node.memory.engine",
        "videokv_node.memory.policies.rekv",
        "videokv_node.models.llava_onevision",
        "videokv_node.ingest.image_decode",
        "videokv_node.ingest.pose_history",
        "videokv_node.pose",
        "videokv_node.synthetic",
    ):
        assert expected in imported


def test_the_guard_catches_a_ros_import(tmp_path):
    """The same script fails when a library module imports rclpy."""
    pkg = tmp_path / "videokv_node"
    for sub in ("memory", "models", "ingest"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "synthetic.py").write_text("")
    (pkg / "pose.py").write_text("")
    (pkg / "memory" / "bad.py").write_text("import rclpy\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "the library must not import ROS: rclpy" in result.stderr
