"""config/memory.yaml and launch/memory.launch.py agree with what the node declares."""

from __future__ import annotations

import ast
import re
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

rclpy = pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from rclpy.context import Context  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402

from videokv_node.ingest.sampler import SamplerConfig  # noqa: E402
from videokv_node.memory.config import POLICIES, QUESTION_STAGES, ConfigError, GenerationConfig, MemoryConfig  # noqa: E402
from videokv_node.ros.launcher import isolated_ros_env  # noqa: E402
from videokv_node.ros.params import NodeSettings, Settings, declare_and_read, parameter_table  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
YAML = REPO / "config" / "memory.yaml"
LAUNCH = REPO / "launch" / "memory.launch.py"


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_yaml_lists_every_declared_parameter_with_its_default():
    doc = yaml.safe_load(YAML.read_text())
    params = flatten(doc["/**"]["ros__parameters"])
    table = parameter_table()
    assert set(params) == set(table), f"yaml only: {set(params) - set(table)}, node only: {set(table) - set(params)}"
    for name, (_, _, default) in table.items():
        value = params[name]
        if isinstance(default, list):
            value = [v for v in value if v]  # [""] stands for an empty list in ROS parameter files
        # Same type too: ROS refuses `1` for a double parameter, and 1 == 1.0 in Python.
        assert value == default and type(value) is type(default), f"{name}: yaml {value!r} != node default {default!r}"


def test_yaml_nests_sections_and_comments_every_parameter():
    """memory.streamkv.* sits under memory: -> streamkv:, never as a dotted key; every parameter says what it is."""
    lines = YAML.read_text().splitlines()
    keys = [line.split(":")[0].strip() for line in lines if ":" in line and not line.lstrip().startswith("#")]
    assert keys and not [k for k in keys if "." in k]
    for section in ("streamkv", "hermes", "mukv", "tgvkv"):
        assert isinstance(yaml.safe_load(YAML.read_text())["/**"]["ros__parameters"]["memory"][section], dict)
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or stripped.endswith(":") or stripped.split(":")[0] in ("/**", "ros__parameters"):
            continue
        # A long string carries its comment on the line above.
        assert " # " in line or lines[i - 1].strip().startswith("#"), f"line {i + 1} has no comment: {line!r}"


@contextmanager
def params_node(monkeypatch, cli_args=(), overrides=()):
    """A node in its own context and DDS domain, with the given command-line parameters and overrides."""
    for key, value in isolated_ros_env().items():
        if key.startswith("ROS_"):
            monkeypatch.setenv(key, value)
    ctx = Context()
    rclpy.init(context=ctx)
    node = Node("videokv", context=ctx, cli_args=list(cli_args), use_global_arguments=False,
                start_parameter_services=False, enable_rosout=False, parameter_overrides=list(overrides))
    try:
        yield node
    finally:
        node.destroy_node()
        rclpy.try_shutdown(context=ctx)


def test_ros_reads_the_yaml_into_exactly_the_defaults(monkeypatch):
    """Through ROS's own parameter-file parser: nested sections, quoted prompts, [""] and doubles round-trip."""
    with params_node(monkeypatch, cli_args=["--ros-args", "--params-file", str(YAML)]) as node:
        settings = declare_and_read(node)
    assert settings == Settings(node=NodeSettings(), memory=MemoryConfig(), generation=GenerationConfig(), sampler=SamplerConfig())
    assert settings.memory.mukv.granularities == ("patch", "frame", "segment")


def test_nested_parameters_reach_the_nested_configs(monkeypatch):
    overrides = [
        Parameter("memory.policy", value="mukv"),
        Parameter("memory.question_stage", value="tgvkv"),
        Parameter("memory.streamkv.guidance_prompt", value="What matters here?"),
        Parameter("memory.hermes.omega_gamma", value=-0.5),  # omega is clamped where used: any value is valid
        Parameter("memory.mukv.granularities", value=["frame", ""]),
        Parameter("memory.mukv.retrieve_patch", value=0),  # 0 = retrieve none of them
        Parameter("memory.tgvkv.keep_ratio", value=1.0),
    ]
    with params_node(monkeypatch, overrides=overrides) as node:
        memory = declare_and_read(node).memory
    assert (memory.policy, memory.question_stage) == ("mukv", "tgvkv")
    assert memory.streamkv.guidance_prompt == "What matters here?"
    assert memory.hermes.omega_gamma == -0.5
    assert memory.mukv.granularities == ("frame",)
    assert memory.mukv.retrieve_patch == 0 and memory.mukv.retrieve_frame == 32
    assert memory.tgvkv.keep_ratio == 1.0


@pytest.mark.parametrize(
    "override, reason",
    [
        (Parameter("memory.mukv.keep_patch", value=1.5), "memory.mukv.keep_patch"),  # the descriptor's range
        (Parameter("memory.hermes.omega0", value=1), "memory.hermes.omega0"),  # an integer for a double
        (Parameter("memory.tgvkv.keep_ratio", value=0.0), "memory.tgvkv.keep_ratio must be in (0, 1]"),
        (Parameter("memory.hermes.reindex", value="now"), "memory.hermes.reindex must be lazy or eager"),
        (Parameter("memory.mukv.granularities", value=[""]), "memory.mukv.granularities must be a non-empty"),
        (Parameter("memory.streamkv.max_segment_frames", value=2), "need 1 <= min_segment_frames <= max_segment_frames"),
        (Parameter("memory.question_stage", value="later"), "memory.question_stage must be one of"),
    ],
)
def test_bad_nested_values_are_config_errors_naming_the_parameter(monkeypatch, override, reason):
    with params_node(monkeypatch, overrides=[override]) as node:
        with pytest.raises(ConfigError, match=re.escape(reason)):
            declare_and_read(node)


def _launch_arguments() -> dict[str, ast.Call]:
    tree = ast.parse(LAUNCH.read_text())
    return {
        node.args[0].value: node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "DeclareLaunchArgument"
    }


def _keyword(call: ast.Call, name: str):
    return next(ast.literal_eval(k.value) for k in call.keywords if k.arg == name)


def test_launch_file_declares_the_documented_arguments_and_agrees_on_qos():
    declared = _launch_arguments()
    assert {"namespace", "params_file", "model", "policy", "question_stage", "image_topic", "use_sim_time"} <= set(declared)
    # The launch file must not override the camera QoS: the node default (sensor_data) holds.
    assert "camera_qos" not in LAUNCH.read_text()
    assert parameter_table()["camera_qos"][2] == "sensor_data"


@pytest.mark.parametrize("argument, parameter, choices", [("policy", "memory.policy", POLICIES),
                                                           ("question_stage", "memory.question_stage", QUESTION_STAGES)])
def test_launch_arguments_default_to_the_node_default_and_name_every_choice(argument, parameter, choices):
    call = _launch_arguments()[argument]
    assert _keyword(call, "default_value") == parameter_table()[parameter][2]
    description = _keyword(call, "description")
    assert all(choice in description for choice in choices), description
    # The argument reaches the node as that parameter.
    source = LAUNCH.read_text()
    assert f'"{parameter}": ParameterValue(LaunchConfiguration("{argument}"), value_type=str)' in source


def test_installed_share_directory_has_launch_and_config():
    from ament_index_python.packages import get_package_share_directory

    share = Path(get_package_share_directory("videokv_node"))
    assert (share / "launch" / "memory.launch.py").is_file()
    assert (share / "config" / "memory.yaml").is_file()


def test_only_the_runtime_parameters_are_writable(monkeypatch):
    """Descriptors: RUNTIME writable (and say so), every other parameter read-only; the yaml header names RUNTIME."""
    from videokv_node.ros.params import RUNTIME

    with params_node(monkeypatch) as node:
        declare_and_read(node)
        descriptors = {name: node.describe_parameter(name) for name in parameter_table()}
    assert RUNTIME <= set(descriptors)
    for name, d in descriptors.items():
        assert d.read_only is (name not in RUNTIME), name
        assert d.description.endswith("(writable at run time)" if name in RUNTIME else "needs a restart)"), name
    header = YAML.read_text().split("/**:")[0]
    assert all(name in header for name in RUNTIME)
