"""config/memory.yaml and launch/memory.launch.py agree with what the node declares."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from videokv_node.ros.params import parameter_table  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_yaml_lists_every_declared_parameter_with_its_default():
    doc = yaml.safe_load((REPO / "config" / "memory.yaml").read_text())
    params = flatten(doc["/**"]["ros__parameters"])
    table = parameter_table()
    assert set(params) == set(table), f"yaml only: {set(params) - set(table)}, node only: {set(table) - set(params)}"
    for name, (_, _, default) in table.items():
        value = params[name]
        if isinstance(default, list):
            value = [v for v in value if v]  # [""] stands for an empty list in ROS parameter files
        assert value == default, f"{name}: yaml {value!r} != node default {default!r}"


def test_launch_file_declares_the_documented_arguments_and_agrees_on_qos():
    source = (REPO / "launch" / "memory.launch.py").read_text()
    tree = ast.parse(source)
    declared = {
        node.args[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "DeclareLaunchArgument"
    }
    assert {"namespace", "params_file", "model", "policy", "image_topic", "use_sim_time"} <= declared
    # The launch file must not override the camera QoS: the node default (sensor_data) holds.
    assert "camera_qos" not in source
    assert parameter_table()["camera_qos"][2] == "sensor_data"


def test_installed_share_directory_has_launch_and_config():
    from ament_index_python.packages import get_package_share_directory

    share = Path(get_package_share_directory("videokv_node"))
    assert (share / "launch" / "memory.launch.py").is_file()
    assert (share / "config" / "memory.yaml").is_file()
