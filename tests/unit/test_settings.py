"""The parameters' single source (videokv_node/settings.py, config_base.param) and the policy registry, without ROS."""

from __future__ import annotations

import dataclasses
import re

import pytest

from videokv_node import parameters_doc
from videokv_node.config_base import ConfigError, param, param_info
from videokv_node.eval.cli import bag_parser
from videokv_node.eval.settings import engine_settings, known_parameters
from videokv_node.ingest.sampler import SamplerConfig
from videokv_node.memory import config as memory_config
from videokv_node.memory.config import (DEFAULT_OPTION_SCORING, OPTION_SCORINGS, POLICIES, POLICY_CONFIGS, GenerationConfig,
                                        MemoryConfig, StreamKVConfig)
from videokv_node.memory.policies.factory import policy_class, policy_classes
from videokv_node.node_settings import model_defaults
from videokv_node.settings import RUNTIME, Settings, build_settings, defaults_for, parameters

# Written out here, independently of the metadata: the parameters `ros2 param set` may change.
EXPECTED_RUNTIME = {
    "sample_fps", "sample_tolerance_s", "question_timeout_s", "max_new_tokens", "max_new_tokens_limit", "answer.option_scoring",
    "answer.locate_rerank", "answer.locate_prompt", "answer.locate_words",
    "memory.budget_tokens", "memory.max_question_tokens", "memory.retrieve_frames",
    "diagnostics_period_s", "diagnostics_silence_warn_s", "diagnostics_silence_error_s", "diagnostics_drop_warn_ratio",
}


def test_runtime_parameters_are_the_documented_ones():
    assert RUNTIME == EXPECTED_RUNTIME


def test_names_follow_the_sections_and_every_parameter_has_a_meaning():
    table = parameters()
    assert len(table) == 141  # + markers.* (7) and sheet.* (7) (issue 46); 119 + memory.redundancy.* (issue 36) + answer.locate_words, memory.rekv.words (issue 34) + gil_switch_interval_s, vision.own_thread (issue 33)
    assert {"sample_fps", "sample_tolerance_s", "sample_reset_backward_s", "memory.streamkv.similarity", "memory.streamkv.split",
            "memory.hermes.recency", "memory.hermes.budget_rule", "pose_wait_s",
            "answer.option_scoring", "memory.rekv.selection", "vision.backend", "spava.archive_bytes", "locate_max_k", "base_frame",
            "memory.redundancy.enabled", "memory.redundancy.max_cell_diff"} <= set(table)
    assert all(p.info.doc.strip() for p in table.values())
    assert table["memory.mukv.granularities"].default == ["patch", "frame", "segment"]  # tuples as ROS lists


def test_a_field_without_a_meaning_is_refused():
    @dataclasses.dataclass
    class Bare:
        x: int = 1

    from videokv_node.settings import _leaves

    with pytest.raises(TypeError, match="Bare.x is a parameter .* without a meaning"):
        list(_leaves("bare.", Bare))
    with pytest.raises(ValueError, match="needs a description"):
        param(1, "")


def test_ranges_come_from_the_metadata():
    table = parameters()
    assert table["memory.retrieve_frames"].info.int_range() == (0, 2**63 - 1)
    assert table["memory.budget_tokens"].info.int_range() == (1, 2**63 - 1)
    assert table["memory.tgvkv.keep_ratio"].info.float_range() == (0.0, 1.0)
    assert table["question_timeout_s"].info.float_range() == (0.0, 1e9)
    assert table["memory.hermes.omega0"].info.float_range() is None


def test_build_settings_from_the_defaults_is_the_default_settings():
    values = {name: p.default for name, p in parameters().items()}
    assert build_settings(values) == Settings(node=build_settings(values).node, memory=MemoryConfig(),
                                              generation=GenerationConfig(), sampler=SamplerConfig())
    values["memory.streamkv.retrieve_frames"] = 3
    assert build_settings(values).memory.streamkv == StreamKVConfig(retrieve_frames=3)
    values["sample_fps"] = "fast"
    with pytest.raises(ConfigError):  # a TypeError inside a dataclass check becomes a ConfigError
        build_settings(values)


def test_preset_defaults_and_the_eval_path_agree_with_the_node_mapping():
    paper = defaults_for({"memory.preset": "paper", "memory.policy": "hermes"})
    assert paper["memory.budget_tokens"] == 4096 and paper["memory.hermes.recency_rate_deep"] == 0.5
    assert defaults_for({})["memory.budget_tokens"] == 16384
    settings = engine_settings({"memory.preset": "paper", "memory.policy": "hermes", "memory.hermes.chunk_frames": 4})
    assert settings.memory.budget_tokens == 4096 and settings.memory.hermes.chunk_frames == 4
    assert known_parameters() == set(model_defaults()) | {n for n in parameters() if n.startswith(("sample_", "memory.", "max_new", "answer."))} | {
        n for n in parameters(("pose", "markers", "sheet"))}  # poses, the drawing: passed on to the node (--via ros), not read by the engine
    with pytest.raises(ConfigError, match="markers.rate_hz must be in"):
        engine_settings({"markers.rate_hz": 50.0})  # refused before a node is started


def test_the_eval_cli_takes_the_node_model_defaults():
    args = bag_parser().parse_args(["bag", "q.json", "--out", "o"])
    assert {k: getattr(args, k) for k in model_defaults()} == model_defaults()
    assert model_defaults() == {"model": "videokv-tiny", "device": "auto", "dtype": "auto", "seed": 0, "torch_threads": 0}


def _option(parser, flag):
    return next(a for a in parser._actions if flag in a.option_strings)


def test_the_eval_cli_takes_its_choices_from_the_config():
    """The policy list and the option scorings are written once (memory/config.py), not in the CLI (issue 35)."""
    policy, scoring = _option(bag_parser(), "--policy"), _option(bag_parser(), "--option-scoring")
    assert tuple(policy.choices) == POLICIES and all(name in policy.help for name in POLICIES)
    assert tuple(scoring.choices)[:len(OPTION_SCORINGS)] == OPTION_SCORINGS
    assert f"default: that parameter's value, {DEFAULT_OPTION_SCORING}" in scoring.help


def test_every_declared_policy_has_one_registered_class_in_declared_order():
    POLICY_CLASSES = policy_classes()  # the one registry: memory/config.py's declarations, classes by module name
    assert POLICIES and list(POLICY_CLASSES) == list(POLICIES)
    assert all(POLICY_CLASSES[name].name == name for name in POLICIES)
    sections = {f.name for f in dataclasses.fields(MemoryConfig)}
    assert {name for name, cls in POLICY_CONFIGS.items() if cls is not None} <= sections


def test_an_undeclared_or_second_policy_fails():
    """One registry (issue 45): a name is a policy only once declared in memory/config.py, and only once."""
    with pytest.raises(ConfigError, match="must be one of"):
        policy_class("lru")
    with pytest.raises(ValueError, match="declared twice"):
        memory_config.declare_policy("rekv")


def test_a_declared_policy_without_a_memory_config_section_fails(monkeypatch):
    @dataclasses.dataclass
    class LRUConfig:
        horizon: int = param(4, "frames")

    monkeypatch.setitem(POLICY_CONFIGS, "lru", LRUConfig)
    with pytest.raises(TypeError, match=r"no section of the declared policies \['lru'\]"):
        memory_config._check_policy_sections()
    with pytest.raises(ModuleNotFoundError, match="videokv_node.memory.policies.lru"):
        policy_class("lru")  # declared, but no memory/policies/lru.py


def test_the_reference_lists_every_parameter_once_with_its_paper_values():
    text = parameters_doc.render()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert sorted(row.split("`")[1] for row in rows) == sorted(parameters())
    budget = next(row for row in rows if row.startswith("| `memory.budget_tokens` |"))
    assert "`16384`" in budget and "hermes: `4096`" in budget and "| yes |" in budget
    keep = next(row for row in rows if row.startswith("| `memory.tgvkv.keep_ratio` |"))
    assert "full" not in keep.split("|")[3]  # the paper's 0.05 is the robot default too: nothing shown
    with pytest.raises(ValueError, match="no generated part"):
        parameters_doc.update("no markers here")


def test_param_info_is_none_for_plain_fields():
    assert param_info(dataclasses.fields(MemoryConfig)[-1]) is None  # the tgvkv section
    assert param_info(dataclasses.fields(MemoryConfig)[0]).doc.startswith("memory policy")


def test_the_policy_docs_have_a_row_per_declared_policy():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "POLICIES.md").read_text()
    missing = [name for name in POLICIES if f"\n| `{name}` |" not in text]
    assert not missing, f"docs/POLICIES.md's policy table has no row for {missing}"


def test_the_eval_cli_names_every_declared_policy_without_importing_memory():
    import subprocess
    import sys

    policy_help = next(a.help for a in bag_parser()._actions if "--policy" in a.option_strings)
    assert all(name in policy_help for name in POLICIES), policy_help
    # --help stays fast: the model defaults come from node_settings, which never imports memory/ (torch).
    code = "import sys; from videokv_node.eval.cli import bag_parser; bag_parser(); print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


@pytest.mark.parametrize("name", sorted(n for n, p in parameters().items() if p.info.choices))
def test_a_choice_parameter_takes_its_choices_and_refuses_others(name):
    p = parameters()[name]
    values = {n: q.default for n, q in parameters().items()}
    if isinstance(p.default, list):
        assert set(p.default) <= set(p.info.choices)
        for choice in p.info.choices:  # any one of them alone
            build_settings({**values, name: [choice]})
        bad = [p.info.choices[0], "bogus"]
    else:
        assert p.default in p.info.choices
        for choice in p.info.choices:
            extra = {"vision.calibration_dir": "/frames"} if (name, choice) == ("vision.precision", "int8") else {}
            build_settings({**values, name: choice, **extra})
        bad = "bogus"
    with pytest.raises(ConfigError, match=re.escape(name)):  # the error names the parameter
        build_settings({**values, name: bad})
