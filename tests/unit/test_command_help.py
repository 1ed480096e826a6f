"""Every command's ``--help`` prints and exits 0: a help string with a bare ``%`` (argparse %-formats them)
crashed ``python -m bench.hour --help`` with a TypeError, found by a user, not a test.

The commands are found, not listed: every module under bench/ and the package with a ``main`` and an
``if __name__ == "__main__"``; each is imported and its ``main(["--help"])`` called in-process. Two are
left out, started by others with arguments of their own: the node (``ros2 run``/launch: ROS arguments)
and Spava's rank entry (``spava/server.py``, under torchrun through ``programs/long_replay``).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "videokv_node" / "videokv_node"
NOT_HERE = {"videokv_node.ros.main", "videokv_node.spava.server"}


def commands() -> list[str]:
    found = []
    for path in sorted([*(REPO / "bench").glob("*.py"), *PACKAGE.rglob("*.py")]):
        text = path.read_text()
        if '__name__ == "__main__"' in text and re.search(r"^def main\(", text, re.M):
            rel = path.relative_to(REPO / "videokv_node" if path.is_relative_to(PACKAGE) else REPO)
            found.append(".".join(rel.with_suffix("").parts))
    return [name for name in found if name not in NOT_HERE]


def test_the_commands_are_found():
    names = commands()
    assert {"bench.hour", "bench.things", "videokv_node.programs.evaluate", "videokv_node.tinyvlm.train_v6"} <= set(names)


@pytest.mark.parametrize("module", commands())
def test_help_prints_and_exits_0(module, capsys):
    if module.startswith(("videokv_node.ros", "videokv_node.programs", "bench.hour_ros", "bench.load", "bench.tf")):
        pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as stop:
        main(["--help"])
    assert stop.value.code == 0
    assert "usage:" in capsys.readouterr().out
