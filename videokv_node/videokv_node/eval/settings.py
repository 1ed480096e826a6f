"""The memory settings of an evaluation, named as the node's ROS parameters.

One dictionary (``memory.policy``, ``memory.budget_tokens``, ``sample_fps``, ``model``,
...) configures both replay paths: ``--via ros`` writes it into the node's parameter
file as is, ``--via engine`` builds the same dataclasses from it here; ``memory.preset`` gives
the defaults of the memory's parameters for the policy, a parameter given explicitly wins
(``memory/presets.py``). The mapping
mirrors ``ros/params.py`` (which imports rclpy, so the library cannot use it): a
nested dataclass field becomes a dotted section, SamplerConfig's fields take the
``sample_`` prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, is_dataclass

from videokv_node.ingest.sampler import SamplerConfig
from videokv_node.memory.config import ConfigError, GenerationConfig, MemoryConfig
from videokv_node.memory.presets import preset_values

# Node parameters the engine path needs too; every other node parameter is the ROS path's business.
MODEL_KEYS = {"model": "videokv-tiny", "device": "auto", "dtype": "auto", "seed": 0, "torch_threads": 0}
_SECTIONS = (("sample_", SamplerConfig), ("memory.", MemoryConfig), ("", GenerationConfig))


def _name(prefix: str, field_name: str) -> str:
    return field_name if field_name.startswith(prefix) else prefix + field_name


def known_parameters() -> set[str]:
    """Every parameter name an evaluation accepts."""
    return set(MODEL_KEYS).union(*(_defaults(p, c) for p, c in _SECTIONS))


def _defaults(prefix: str, cls: type) -> dict[str, object]:
    defaults, out = cls(), {}
    for f in fields(cls):
        value = getattr(defaults, f.name)
        out.update(_defaults(_name(prefix, f.name) + ".", type(value)) if is_dataclass(value) else {_name(prefix, f.name): value})
    return out


def typed_parameters(params: dict) -> dict:
    """The parameters with the node's types: an integer given for a floating-point parameter
    becomes a float (a ROS parameter file would refuse ``sample_fps: 1``), tuples become lists."""
    defaults = dict(MODEL_KEYS)
    for prefix, cls in _SECTIONS:
        defaults.update(_defaults(prefix, cls))
    out = {}
    for name, value in params.items():
        default = defaults.get(name)
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


def _build(prefix: str, cls: type, params: dict):
    defaults, kwargs = cls(), {}
    for f in fields(cls):
        name, value = _name(prefix, f.name), getattr(defaults, f.name)
        if is_dataclass(value):
            kwargs[f.name] = _build(name + ".", type(value), params)
        elif name in params:
            got = params[name]
            kwargs[f.name] = tuple(got) if isinstance(value, tuple) else got
    return cls(**kwargs)


@dataclass(frozen=True, slots=True)
class EngineSettings:
    model: str
    device: str
    dtype: str
    seed: int
    torch_threads: int
    memory: MemoryConfig
    generation: GenerationConfig
    sampler: SamplerConfig


def engine_settings(params: dict) -> EngineSettings:
    """Validated settings from ROS-named parameters; ConfigError names an unknown or bad one."""
    unknown = sorted(set(params) - known_parameters())
    if unknown:
        raise ConfigError(f"unknown parameter(s) {', '.join(unknown)}; see config/memory.yaml for the names")
    model = {k: params.get(k, v) for k, v in MODEL_KEYS.items()}
    try:
        # memory.preset's values for the policy, then the explicit parameters over them (memory/presets.py).
        memory_defaults = MemoryConfig()
        preset = preset_values(str(params.get("memory.preset", memory_defaults.preset)), str(params.get("memory.policy", memory_defaults.policy)))
        params = {**{"memory." + k: v for k, v in preset.items()}, **params}
        sampler, memory, generation = (_build(p, c, params) for p, c in _SECTIONS)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc
    return EngineSettings(**model, memory=memory, generation=generation, sampler=sampler)


def parse_param(text: str) -> tuple[str, object]:
    """``name=value`` from the command line; the value is read as YAML (numbers, booleans, lists)."""
    import yaml

    name, sep, raw = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"expected NAME=VALUE, got {text!r}")
    value = yaml.safe_load(raw) if raw.strip() else ""
    return name.strip(), value
