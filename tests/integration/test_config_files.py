"""config/memory.yaml and launch/memory.launch.py agree with what the node declares."""

from __future__ import annotations

import ast
import re
import runpy
import sys
import types
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

rclpy = pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from rclpy.context import Context  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.parameter import Parameter  # noqa: E402

from videokv_node.ingest.sampler import SamplerConfig  # noqa: E402
from videokv_node.memory.config import (POLICIES, POLICY_CONFIGS, QUESTION_STAGES, ConfigError, GenerationConfig,  # noqa: E402
                                        MemoryConfig)
from videokv_node.programs.launcher import isolated_ros_env  # noqa: E402
from videokv_node.ros.params import NodeSettings, Settings, declare_and_read, parameter_table  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
YAML = REPO / "config" / "memory.yaml"
LAUNCH = REPO / "launch" / "memory.launch.py"
README = REPO / "README.md"
PARAMETERS_MD = REPO / "docs" / "PARAMETERS.md"


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def preset_changed() -> set[str]:
    """Parameters whose value some policy's paper preset changes from the robot default (independent of the yaml)."""
    from videokv_node.memory.records.presets import PAPER

    table = parameter_table()
    return {f"memory.{k}" for values in PAPER.values() for k, v in values.items()
            if (list(v) if isinstance(v, tuple) else v) != table[f"memory.{k}"][2]}


def test_yaml_leaves_the_preset_decided_parameters_commented():
    """What a preset changes is not pinned by the default file (an explicit value would win over the
    preset), but shown commented "#~" with its robot value; everything else is set."""
    text = YAML.read_text()
    plain = flatten(yaml.safe_load(text)["/**"]["ros__parameters"])
    full = flatten(yaml.safe_load(text.replace("#~ ", ""))["/**"]["ros__parameters"])
    assert set(full) - set(plain) == preset_changed()


def test_yaml_lists_every_declared_parameter_with_its_default():
    doc = yaml.safe_load(YAML.read_text().replace("#~ ", ""))  # the preset-decided ones too
    params = flatten(doc["/**"]["ros__parameters"])
    table = parameter_table()
    assert set(params) == set(table), f"yaml only: {set(params) - set(table)}, node only: {set(table) - set(params)}"
    for name, (_, _, default) in table.items():
        value = params[name]
        if isinstance(default, list):
            value = [v for v in value if v]  # [""] stands for an empty list in ROS parameter files
        # Same type too: ROS refuses `1` for a double parameter, and 1 == 1.0 in Python.
        assert value == default and type(value) is type(default), f"{name}: yaml {value!r} != node default {default!r}"


def test_every_declared_parameter_is_in_the_reference_and_the_reference_is_current():
    """docs/PARAMETERS.md has a row per parameter the node declares, and its tables are what
    `python -m videokv_node.parameters_doc` generates from the dataclass fields."""
    from videokv_node.parameters_doc import update

    text = PARAMETERS_MD.read_text()
    missing = [name for name in parameter_table() if not re.search(rf"^\| `{re.escape(name)}` \|", text, re.MULTILINE)]
    assert not missing, f"parameters without a row in docs/PARAMETERS.md: {missing}"
    assert update(text) == text, "docs/PARAMETERS.md is out of date: run python -m videokv_node.parameters_doc"
    assert "docs/PARAMETERS.md" in README.read_text()  # the README links the reference


def test_yaml_nests_sections_and_comments_every_parameter():
    """memory.streamkv.* sits under memory: -> streamkv:, never as a dotted key; every parameter says what it is."""
    lines = YAML.read_text().splitlines()
    keys = [line.split(":")[0].strip() for line in lines if ":" in line and not line.lstrip().startswith("#")]
    assert keys and not [k for k in keys if "." in k]
    for section in [name for name, cls in POLICY_CONFIGS.items() if cls is not None] + ["tgvkv"]:  # every section
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


def test_launch_file_declares_the_documented_arguments_and_agrees_on_qos():
    declared = _launch_arguments()
    assert {"namespace", "params_file", "model", "policy", "question_stage", "image_topic", "use_sim_time", "lifecycle"} <= set(declared)
    # The launch file must not override the camera QoS: the node default (sensor_data) holds.
    assert "camera_qos" not in LAUNCH.read_text()
    assert parameter_table()["camera_qos"][2] == "sensor_data"


def _declared(launch_description) -> dict[str, dict]:
    """Each declared launch argument's keyword arguments (default_value, description), as evaluated."""
    entities, _ = launch_description
    return {e.args[0]: e.kwargs for e in entities if type(e).__name__ == "DeclareLaunchArgument"}


@pytest.mark.parametrize("argument, choices", [("policy", POLICIES), ("question_stage", QUESTION_STAGES)])
def test_launch_arguments_name_every_choice(launch_description, argument, choices):
    description = _declared(launch_description)[argument]["description"]
    assert all(choice in description for choice in choices), description


def test_every_launch_argument_but_the_file_and_namespace_defaults_to_empty_meaning_not_given(launch_description):
    """An empty default sets nothing (the params file's value stands); and says so."""
    for name, kwargs in _declared(launch_description).items():
        if name in ("namespace", "params_file"):
            continue
        assert kwargs["default_value"] == "", name
        assert "Empty (the default): as the params file says." in kwargs["description"], name


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


class _Recorded:
    """Stands for any class of launch / launch_ros (not installable here): keeps its arguments."""

    def __init__(self, *args, **kwargs) -> None:
        self.args, self.kwargs = args, kwargs

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and (self.args, self.kwargs) == (other.args, other.kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}{self.args}{self.kwargs}"

    def perform(self, context: dict) -> str:
        """As a LaunchConfiguration at launch time: its value in ``context`` (argument name -> text)."""
        return context[self.args[0]]


def _stub_module(name: str) -> types.ModuleType:
    """A module whose every attribute is a _Recorded subclass of that name (the same class each time)."""
    module = types.ModuleType(name)
    classes: dict[str, type] = {}
    module.__getattr__ = lambda attr: classes.setdefault(attr, type(attr, (_Recorded,), {}))
    return module


@pytest.fixture()
def launch_description(monkeypatch):
    """generate_launch_description() run against recording stand-ins of launch and launch_ros.

    Kept beside the real `ros2 launch` runs (test_launch_ros.py) for what those cannot check:
    the launch file's structure (the plain and the lifecycle node described identically but for
    their condition, every argument documented), and without ../shared/ros2tools at all.
    """
    for name in ("launch", "launch.actions", "launch.conditions", "launch.substitutions", "launch_ros",
                 "launch_ros.actions", "launch_ros.parameter_descriptions", "launch_ros.substitutions"):
        monkeypatch.setitem(sys.modules, name, _stub_module(name))
    description = runpy.run_path(str(LAUNCH))["generate_launch_description"]()
    return description.args[0], sys.modules


def _launched_nodes(entities, **arguments) -> list:
    """The node actions the launch's OpaqueFunction gives for these launch arguments (the others at
    their declared defaults; params_file: the repository's config/memory.yaml)."""
    (opaque,) = [e for e in entities if type(e).__name__ == "OpaqueFunction"]
    defaults = {name: "" for name in _launch_arguments()}
    return opaque.kwargs["function"]({**defaults, "params_file": str(YAML), **arguments})


def _launched(entities, **arguments):
    """(the one node action, the parameter overrides it passes after the params file)."""
    (node,) = _launched_nodes(entities, **arguments)
    assert node.kwargs["parameters"][0] == sys.modules["launch.substitutions"].LaunchConfiguration("params_file")
    return node, node.kwargs["parameters"][1]


# Every launch argument that sets a parameter: a given text, the parameter and the value it must get.
GIVEN = {
    "model": ("tiny-qwen2.5-vl", "model", "tiny-qwen2.5-vl"),
    "policy": ("hermes", "memory.policy", "hermes"),
    "question_stage": ("tgvkv", "memory.question_stage", "tgvkv"),
    "pose_topic": ("/odom", "pose_topic", "/odom"),
    "use_sim_time": ("True", "use_sim_time", True),
    "lifecycle": ("false", "lifecycle", False),
    "image_topic": ("/cam/image_raw", "image_topics", ["/cam/image_raw"]),
    "snapshot_period_s": ("5", "memory.snapshot_period_s", 5.0),
}


def test_every_parameter_setting_argument_is_in_the_matrix(launch_description):
    """GIVEN covers every declared argument but those that set no parameter of their own."""
    assert set(GIVEN) == set(_launch_arguments()) - {"namespace", "params_file", "memory_dir"}
    for argument, (_, parameter, _) in GIVEN.items():
        assert parameter in parameter_table() or parameter == "use_sim_time", parameter


@pytest.mark.parametrize("argument", sorted(GIVEN))
def test_a_launch_argument_sets_its_parameter_only_when_given(launch_description, argument):
    """Given: its parameter, typed, passed after the params file (so it wins). Not given (empty, or
    blanks): nothing, so the file's value stands, or the node's default where the file has none."""
    entities, _ = launch_description
    text, parameter, value = GIVEN[argument]
    _, overrides = _launched(entities, **{argument: text})
    assert overrides == {parameter: value}
    assert type(overrides[parameter]) is type(value)
    for empty in ("", "  "):
        assert _launched(entities, **{argument: empty})[1] == {}


def test_all_arguments_given_set_all_their_parameters(launch_description):
    entities, _ = launch_description
    _, overrides = _launched(entities, **{a: text for a, (text, _, _) in GIVEN.items()})
    assert overrides == {parameter: value for _, parameter, value in GIVEN.values()}


@pytest.mark.parametrize("argument, text", [("use_sim_time", "maybe"), ("lifecycle", "1"), ("snapshot_period_s", "often")])
def test_a_launch_argument_of_the_wrong_type_is_refused_naming_it(launch_description, argument, text):
    entities, _ = launch_description
    with pytest.raises(ValueError, match=f"launch argument {argument}:="):
        _launched_nodes(entities, **{argument: text})


def test_the_lifecycle_argument_or_else_the_params_file_picks_the_node_kind(launch_description, tmp_path):
    """Exactly one node action: LifecycleNode or Node, by the argument when given, else by the file's
    `lifecycle` for this node (the node's main reads the same parameter); otherwise the same node."""
    entities, modules = launch_description
    actions, substitutions = modules["launch_ros.actions"], modules["launch.substitutions"]
    managed_file = tmp_path / "managed.yaml"
    managed_file.write_text(yaml.safe_dump({"/**": {"ros__parameters": {"lifecycle": True}}}))
    cases = [({}, actions.Node), ({"lifecycle": "true"}, actions.LifecycleNode),
             ({"params_file": str(managed_file)}, actions.LifecycleNode),
             ({"params_file": str(managed_file), "lifecycle": "false"}, actions.Node)]
    kinds = []
    for arguments, kind in cases:
        node, _ = _launched(entities, **arguments)
        assert type(node) is kind, arguments
        kinds.append(node.kwargs)
    for kwargs in kinds:
        kwargs.pop("parameters")
        assert kwargs == kinds[0]
    assert (kinds[0]["name"], kinds[0]["executable"]) == ("videokv", "videokv_node")
    assert kinds[0]["namespace"] == substitutions.LaunchConfiguration("namespace")
    assert "remappings" not in kinds[0]  # image_topic sets image_topics, which wins over the file's list


def test_the_params_file_is_read_for_the_node_as_rclpy_reads_it(launch_description, tmp_path):
    """file_parameter: sections /**, /* and the node's full name (leading / optional), later winning;
    nested and dotted keys; None for what the file does not set, and for an unreadable file."""
    assert launch_description  # launch and launch_ros stood in for, so the file can be run
    file_parameter = runpy.run_path(str(LAUNCH))["file_parameter"]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({
        "robot1/videokv": {"ros__parameters": {"memory": {"policy": "mukv"}}},
        "/**": {"ros__parameters": {"memory.policy": "hermes", "lifecycle": True, "model": "tiny"}},
        "/other": {"ros__parameters": {"model": "other"}},
    }))
    assert file_parameter(str(path), "/robot1/videokv", "memory.policy") == "mukv"
    assert file_parameter(str(path), "/videokv", "memory.policy") == "hermes"
    assert file_parameter(str(path), "/robot1/videokv", "model") == "tiny"
    assert file_parameter(str(path), "/robot1/videokv", "pose_topic") is None
    assert file_parameter(str(tmp_path / "absent.yaml"), "/videokv", "model") is None
    assert file_parameter(str(YAML), "/videokv", "memory.snapshot_period_s") == 0.0


def test_memory_dir_turns_on_snapshots_and_restore_with_a_period_from_the_argument_the_file_or_the_default(
        launch_description, tmp_path):
    """Without memory_dir the launch sets no snapshot parameter (a params file's stand); with it, the
    directory, restore_on_start: latest and a period: the argument's as given, else the file's if above 0, else 60 s."""
    entities, _ = launch_description
    snap = {"memory.snapshot_dir": "/var/lib/videokv", "memory.restore_on_start": "latest"}
    assert _launched(entities, memory_dir="")[1] == {}
    assert _launched(entities, memory_dir="/var/lib/videokv")[1] == {**snap, "memory.snapshot_period_s": 60.0}
    for given in (2.5, 0.0):  # given, it stands, 0 (restore only) too
        assert _launched(entities, memory_dir="/var/lib/videokv", snapshot_period_s=str(given))[1] == {
            **snap, "memory.snapshot_period_s": given}
    own = tmp_path / "own.yaml"
    own.write_text(yaml.safe_dump({"videokv": {"ros__parameters": {"memory": {"snapshot_period_s": 30.0}}}}))
    assert _launched(entities, memory_dir="/var/lib/videokv", params_file=str(own))[1] == {
        **snap, "memory.snapshot_period_s": 30.0}


def test_every_launch_argument_is_documented_in_the_readme(launch_description):
    entities, _ = launch_description
    declared = [e.args[0] for e in entities if type(e).__name__ == "DeclareLaunchArgument"]
    assert declared == list(_launch_arguments())  # the ast view and the evaluated one agree
    readme = README.read_text()
    missing = [name for name in declared if not re.search(rf"^\| `{name}` \|", readme, re.MULTILINE)]
    assert not missing, f"launch arguments without a row in the README's launch table: {missing}"


def test_the_fast_dds_profile_for_large_images_keeps_the_builtin_transports():
    """config/fastdds_large_images.xml (docs/OPERATIONS.md, "Large raw images") parses, is the default
    profile, adds a shared-memory segment of at least 4 MiB and keeps the built-in transports (UDP)."""
    import xml.etree.ElementTree as ET
    from pathlib import Path

    ns = {"f": "http://www.eprosima.com/XMLSchemas/fastRTPS_Profiles"}
    root = ET.parse(Path(__file__).resolve().parents[2] / "config" / "fastdds_large_images.xml").getroot()
    shm = [t for t in root.iterfind("f:transport_descriptors/f:transport_descriptor", ns) if t.findtext("f:type", namespaces=ns) == "SHM"]
    assert len(shm) == 1 and int(shm[0].findtext("f:segment_size", namespaces=ns)) >= 4 << 20
    participant = root.find("f:participant", ns)
    assert participant.get("is_default_profile") == "true"
    assert participant.findtext("f:rtps/f:useBuiltinTransports", namespaces=ns) == "true"
    assert participant.findtext("f:rtps/f:userTransports/f:transport_id", namespaces=ns) == shm[0].findtext("f:transport_id", namespaces=ns)
