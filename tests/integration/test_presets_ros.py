"""memory.preset through ROS parameters: the preset's values become the declared defaults, an explicit
value wins (issue 15)."""

from __future__ import annotations

import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from rclpy.parameter import Parameter  # noqa: E402

from tests.integration.test_config_files import YAML, params_node  # noqa: E402
from videokv_node.memory.config import ConfigError, MemoryConfig  # noqa: E402
from videokv_node.ros.params import declare, declare_and_read, read_settings  # noqa: E402


def test_paper_preset_gives_the_defaults_and_an_explicit_parameter_wins(monkeypatch):
    overrides = [
        Parameter("memory.preset", value="paper"),
        Parameter("memory.policy", value="hermes"),
        Parameter("memory.hermes.chunk_frames", value=8),
    ]
    with params_node(monkeypatch, overrides=overrides) as node:
        memory = declare_and_read(node).memory
        shown = node.get_parameter("memory.budget_tokens").value  # what `ros2 param get` shows
    assert (memory.preset, memory.budget_tokens, shown) == ("paper", 4096, 4096)
    assert (memory.hermes.pseudo_queries, memory.hermes.recency_rate_deep, memory.hermes.schedule_end) == ("live", 0.5, "first_deep")
    assert memory.hermes.chunk_frames == 8  # explicit, over the preset's 16
    assert memory.local_window_tokens == MemoryConfig().local_window_tokens  # not HERMES' to change


def test_paper_preset_for_rekv(monkeypatch):
    overrides = [Parameter("memory.preset", value="paper"), Parameter("memory.retrieve_frames", value=16)]
    with params_node(monkeypatch, overrides=overrides) as node:
        memory = declare_and_read(node).memory
    assert (memory.policy, memory.local_window_tokens, memory.retrieve_frames) == ("rekv", 15000, 16)
    assert (memory.rekv.query, memory.rekv.question_window) == ("question", False)


def test_the_default_yaml_lets_the_preset_decide_what_it_changes(monkeypatch):
    """config/memory.yaml (what the launch file loads) leaves the preset-decided parameters out, so
    memory.preset: paper beside it takes effect; a line of it uncommented wins over the preset."""
    args = ["--ros-args", "--params-file", str(YAML), "-p", "memory.preset:=paper"]
    with params_node(monkeypatch, cli_args=args) as node:
        memory = declare_and_read(node).memory
    assert memory.preset == "paper" and memory.retrieve_frames == 64 and memory.rekv.query == "question"
    assert memory.local_window_tokens == 15000
    args += ["-p", "memory.retrieve_frames:=8"]
    with params_node(monkeypatch, cli_args=args) as node:
        memory = declare_and_read(node).memory
    assert memory.retrieve_frames == 8 and memory.rekv.query == "question"


def test_a_preset_change_after_declaring_is_refused(monkeypatch):
    """A lifecycle node may set parameters while unconfigured; a new preset cannot re-default the others."""
    with params_node(monkeypatch) as node:
        declare(node, lifecycle=True)
        node.set_parameters([Parameter("memory.policy", value="hermes")])
        assert read_settings(node).memory.policy == "hermes"  # robot: no preset values to go stale
        node.set_parameters([Parameter("memory.preset", value="paper")])
        with pytest.raises(ConfigError, match="restart the node"):
            read_settings(node)
