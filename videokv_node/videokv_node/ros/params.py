"""ROS parameters of the node: declared with descriptors generated from the dataclasses' fields.

The parameters, their names, defaults, meanings and ranges are ``videokv_node/settings.py``'s
(each written next to its dataclass field, ``config_base.param``); this module only turns them
into ROS: a ``ParameterDescriptor`` per field, the declaration with ``memory.preset``'s defaults,
and reading the values back into validated ``Settings``. config/memory.yaml lists every parameter
with a comment and docs/PARAMETERS.md is generated from the same table (tests check both).
Parameters in ``RUNTIME`` may be set while the node runs (``ros2 param set``): the
node checks the whole new configuration with ``settings_with`` (the dataclasses'
own checks, as at start) and refuses a bad value with the reason. Every other
parameter is read-only: a change of model, device, policy, topics, QoS, queues,
host arena or any policy's hyper-parameters needs a restart. On the lifecycle node
(``lifecycle: true``) a restart is cleanup then configure: there every parameter but
``lifecycle`` may be set while the node is unconfigured (the node's callback refuses
the others in every other state), and configure reads and checks them all.
"""

from __future__ import annotations

import weakref

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.exceptions import ParameterException
from rclpy.node import Node
from rclpy.parameter import Parameter

from videokv_node.memory.config import ConfigError
from videokv_node.memory.records.presets import preset_values
# Re-exported: the node and its tests take the settings' types from here.
from videokv_node.node_settings import NodeSettings, SpavaSettings  # noqa: F401
from videokv_node.settings import RUNTIME, Settings, build_settings, defaults_for, parameter_table, parameters  # noqa: F401

# The (preset, policy) each node's parameter defaults were declared for (see ``declare``).
_DECLARED_FOR: "weakref.WeakKeyDictionary[Node, tuple[str, str]]" = weakref.WeakKeyDictionary()


def _descriptor(name: str, default: object, lifecycle: bool = False) -> ParameterDescriptor:
    """The descriptor of parameter ``name``: its field's description, writability and range."""
    info = parameters()[name].info
    if info.runtime:
        suffix = " (writable at run time)"
    elif lifecycle and name != "lifecycle":
        suffix = " (writable while unconfigured; read at configure)"
    else:
        suffix = " (read-only: a change needs a restart)"
    d = ParameterDescriptor(description=info.doc + suffix, read_only=not (info.runtime or suffix.startswith(" (writable while unconfigured")))
    if isinstance(default, bool):
        return d
    if isinstance(default, int):
        lo, hi = info.int_range()
        d.integer_range = [IntegerRange(from_value=lo, to_value=hi, step=0)]
    elif isinstance(default, float) and (span := info.float_range()) is not None:
        d.floating_point_range = [FloatingPointRange(from_value=span[0], to_value=span[1], step=0.0)]
    if isinstance(default, list):
        d.dynamic_typing = False
    return d


def declare_and_read(node: Node) -> Settings:
    """Declare every parameter and build validated settings; raises ConfigError with the bad field."""
    declare(node)
    return read_settings(node)


def declare(node: Node, lifecycle: bool = False) -> None:
    """Declare every parameter with its descriptor (``lifecycle``: writable while unconfigured).

    Raises ConfigError naming the parameter whose given value has the wrong type or is
    outside the descriptor's range; the values' consistency is ``read_settings``' check.
    ``memory.preset`` and ``memory.policy`` are declared first: every other parameter's
    default is then the preset's value for that policy (``memory/records/presets.py``), so a value
    given to the node wins over the preset and ``ros2 param get`` shows what is in force.
    """
    table = parameters()
    first = {}
    for name in ("memory.preset", "memory.policy"):  # read first: they choose the others' defaults
        _declare_one(node, name, table[name].default, lifecycle)
        first[name] = node.get_parameter(name).value
    defaults = defaults_for(first)
    _DECLARED_FOR[node] = (first["memory.preset"], first["memory.policy"])
    for name in table:
        if name not in first:
            _declare_one(node, name, defaults[name], lifecycle)


def _declare_one(node: Node, name: str, default: object, lifecycle: bool) -> None:
    """Declare ``name`` with ``default`` (its value unless the node was given one) and its descriptor."""
    try:
        if isinstance(default, list):
            # Declared with its value, so `ros2 param get/dump` show it however the node was started;
            # [""] stands for an empty list (a parameter cannot hold a typed empty array).
            node.declare_parameter(name, [str(v) for v in default] or [""], _descriptor(name, default, lifecycle))
        else:
            node.declare_parameter(name, default, _descriptor(name, default, lifecycle))
    except ParameterException as exc:  # wrong type or outside the descriptor's range; names the parameter
        raise ConfigError(str(exc)) from exc


def read_settings(node: Node) -> Settings:
    """Validated settings from the declared parameters; raises ConfigError with the reason."""
    return settings_with(node, [])


def settings_with(node: Node, changes: list[Parameter]) -> Settings:
    """The settings the node would have with ``changes`` applied to its declared parameters,
    validated as at start; raises ConfigError with the reason (nothing is set here)."""
    values: dict[str, object] = {}
    for name, p in parameters().items():
        default = p.default
        value = node.get_parameter_or(name).value  # None: a string array declared unset, as at start
        values[name] = tuple(value if value is not None else default) if isinstance(default, list) else value
    for param in changes:
        if param.name not in values:
            raise ConfigError(f"unknown parameter {param.name!r}")
        if param.name not in RUNTIME:
            raise ConfigError(f"{param.name} is read-only: a change needs a restart (lifecycle node: cleanup, set, configure)")
        values[param.name] = param.value
    declared = _DECLARED_FOR.get(node)
    if declared is not None and preset_values(*declared) != preset_values(str(values["memory.preset"]), str(values["memory.policy"])):
        raise ConfigError(
            f"memory.preset / memory.policy are {values['memory.preset']} / {values['memory.policy']}, but the other "
            f"parameters took the defaults of {declared[0]} / {declared[1]} when declared: restart the node to change them"
        )
    return build_settings(values)
