"""Every node parameter by its dotted name, mapped onto the dataclasses that validate it; no ROS here.

One mapping for all who read parameters: the node declares them (``ros/params.py`` turns each
field's ``ParamInfo`` into a ROS descriptor), the evaluation CLI builds the engine's configs from
the same names (``eval/settings.py``), and docs/PARAMETERS.md and config/memory.yaml are
generated from or checked against ``parameter_table`` (``python -m videokv_node.parameters_doc``).

Names: a field of a section is ``prefix + field`` unless the field already starts with the
prefix (``SamplerConfig.sample_fps`` stays ``sample_fps``, ``tolerance_s`` is
``sample_tolerance_s``); a field holding a dataclass (``MemoryConfig.streamkv``) is a section of
its own, its fields the parameters ``memory.streamkv.<field>``. Defaults are the dataclasses'
(the ``robot`` preset); ``defaults_for`` lays a ``memory.preset`` over them.
"""

from __future__ import annotations

import functools

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from types import MappingProxyType
from typing import NamedTuple

from videokv_node.config_base import ConfigError, ParamInfo, param_info
from videokv_node.ingest.pose_history import PoseConfig
from videokv_node.ingest.sampler import SamplerConfig
from videokv_node.memory.config import GenerationConfig, MemoryConfig
from videokv_node.memory.records.presets import apply_to_parameters
# The node's own settings live in a module without memory/ (the eval CLI reads the model defaults cheaply).
from videokv_node.node_settings import LocateSettings, MarkerSettings, NodeSettings, SheetSettings, SpavaSettings
from videokv_node.vision.config import VisionConfig


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the node reads from its parameters, each part validated by its own dataclass."""

    node: NodeSettings
    memory: MemoryConfig
    generation: GenerationConfig
    sampler: SamplerConfig
    vision: VisionConfig = VisionConfig()
    spava: SpavaSettings = field(default_factory=SpavaSettings)  # a default: Spava is an optional add-on
    pose: PoseConfig = PoseConfig()  # robot poses stored with the frames (issue 17); off by default
    locate: LocateSettings = LocateSettings()
    markers: MarkerSettings = MarkerSettings()  # ~/memory_markers, ~/answer_markers (issue 46)
    sheet: SheetSettings = SheetSettings()  # ~/memory_sheet (issue 46)


# (Settings field, name prefix, dataclass), in the order parameters are declared and documented.
SECTIONS = (
    ("node", "", NodeSettings),
    ("sampler", "sample_", SamplerConfig),
    ("memory", "memory.", MemoryConfig),
    ("generation", "", GenerationConfig),
    ("vision", "vision.", VisionConfig),
    ("spava", "spava.", SpavaSettings),
    ("pose", "", PoseConfig),
    ("locate", "locate_", LocateSettings),
    ("markers", "markers.", MarkerSettings),
    ("sheet", "sheet.", SheetSettings),
)
# The sections an evaluation's engine is built from (the rest is the node's own business).
ENGINE_SECTIONS = ("sampler", "memory", "generation")


class Parameter(NamedTuple):
    """One node parameter: its name, where it lives, its default (a list for a tuple field) and its meaning."""

    name: str
    section: type  # the dataclass holding the field
    field: str
    default: object
    info: ParamInfo


def ros_name(prefix: str, field_name: str) -> str:
    return field_name if field_name.startswith(prefix) else prefix + field_name


def _leaves(prefix: str, cls: type) -> Iterator[Parameter]:
    """Every non-dataclass field of cls as a Parameter, nested sections flattened."""
    defaults = cls()
    for f in fields(cls):
        name, default = ros_name(prefix, f.name), getattr(defaults, f.name)
        if is_dataclass(default):
            yield from _leaves(name + ".", type(default))
            continue
        info = param_info(f)
        if info is None:
            raise TypeError(f"{cls.__name__}.{f.name} is a parameter ({name}) without a meaning: declare it with config_base.param")
        yield Parameter(name, cls, f.name, list(default) if isinstance(default, tuple) else default, info)


@functools.cache
def parameters(sections: tuple[str, ...] | None = None) -> Mapping[str, Parameter]:
    """Every parameter by name (of ``sections`` only, Settings' field names, if given), in declaration order."""
    return MappingProxyType({p.name: p for attr, prefix, cls in SECTIONS if sections is None or attr in sections
                             for p in _leaves(prefix, cls)})


def parameter_table() -> dict[str, tuple[type, str, object]]:
    """ROS name -> (dataclass holding the field, field, default), for every parameter the node declares."""
    return {name: (p.section, p.field, p.default) for name, p in parameters().items()}


# Writable at run time (the fields declared ``runtime=True``). Safe because each is read afresh
# where used: the sampler's config under its lock, the node's timeout per request, the engine's
# budget, question and generation limits on the model thread between two frames (a smaller budget
# evicts at once), the health monitor's thresholds under its lock, the diagnostics timer's period by rcl.
RUNTIME = frozenset(name for name, p in parameters().items() if p.info.runtime)


def defaults_for(given: Mapping[str, object]) -> dict[str, object]:
    """Every parameter's default under the ``memory.preset`` / ``memory.policy`` in ``given`` (else the defaults')."""
    return apply_to_parameters(given, {name: p.default for name, p in parameters().items()})


def build(prefix: str, cls: type, values: Mapping[str, object]) -> object:
    """cls from ``values`` by parameter name (a name not given keeps its default), nested sections first;
    each dataclass validates itself. A list for a tuple field becomes a tuple."""
    defaults, kwargs = cls(), {}
    for f in fields(cls):
        name, default = ros_name(prefix, f.name), getattr(defaults, f.name)
        if is_dataclass(default):
            kwargs[f.name] = build(name + ".", type(default), values)
        elif name in values:
            value = values[name]
            kwargs[f.name] = tuple(value) if isinstance(default, tuple) else value
    return cls(**kwargs)


def build_sections(values: Mapping[str, object], sections: tuple[str, ...]) -> dict[str, object]:
    """Settings' fields ``sections`` built from ``values``; ConfigError with the reason of the first bad one."""
    try:
        return {attr: build(prefix, cls, values) for attr, prefix, cls in SECTIONS if attr in sections}
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:  # a wrong type, or a check of ingest/ that raises ValueError
        raise ConfigError(str(exc)) from exc


def build_settings(values: Mapping[str, object]) -> Settings:
    """Validated settings from every parameter's value by name; ConfigError with the reason."""
    return Settings(**build_sections(values, tuple(attr for attr, _, _ in SECTIONS)))
