"""The memory settings of an evaluation, named as the node's ROS parameters.

One dictionary (``memory.policy``, ``memory.budget_tokens``, ``sample_fps``, ``model``,
...) configures both replay paths: ``--via ros`` writes it into the node's parameter
file as is, ``--via engine`` builds the same dataclasses from it here; ``memory.preset`` gives
the defaults of the memory's parameters for the policy, a parameter given explicitly wins
(``memory/records/presets.py``). The names, defaults and mapping onto the dataclasses are the node's
own, from ``videokv_node/settings.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from videokv_node.ingest.sampler import SamplerConfig
from videokv_node.memory.config import ConfigError, GenerationConfig, MemoryConfig
from videokv_node.node_settings import model_defaults
from videokv_node.settings import ENGINE_SECTIONS, build_sections, defaults_for, parameters


# Sections an evaluation accepts and passes on to the node (``--via ros``) that the engine does not read:
# poses (``pose_topic`` ..., so that a bag's odometry or tf, which the replay passes on, gives the answers' poses), and
# the memory's drawing (``markers.*``, ``sheet.*``: a replay that records ``~/memory_markers``, programs/memory_capture.py).
NODE_SECTIONS = ("pose", "markers", "sheet")


def _defaults() -> dict[str, object]:
    """Default of every parameter an evaluation accepts: the model's, the engine sections' and NODE_SECTIONS'."""
    out = model_defaults()
    out.update({name: p.default for name, p in parameters(ENGINE_SECTIONS + NODE_SECTIONS).items()})
    return out


def known_parameters() -> set[str]:
    """Every parameter name an evaluation accepts."""
    return set(_defaults())


def typed_parameters(params: dict) -> dict:
    """The parameters with the node's types: an integer given for a floating-point parameter
    becomes a float (a ROS parameter file would refuse ``sample_fps: 1``), tuples become lists."""
    defaults = _defaults()
    out = {}
    for name, value in params.items():
        default = defaults.get(name)
        if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        out[name] = list(value) if isinstance(value, tuple) else value
    return out


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
    model = {k: params.get(k, v) for k, v in model_defaults().items()}
    # memory.preset's values for the policy, then the explicit parameters over them (memory/records/presets.py).
    memory_defaults = {name: value for name, value in defaults_for(params).items() if name.startswith("memory.")}
    sections = build_sections({**memory_defaults, **params}, ENGINE_SECTIONS)
    build_sections(params, NODE_SECTIONS)  # validated here (a bad pose_type refused before the node starts), not kept
    return EngineSettings(**model, **sections)


def parse_param(text: str) -> tuple[str, object]:
    """``name=value`` from the command line; the value is read as YAML (numbers, booleans, lists)."""
    import yaml

    name, sep, raw = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"expected NAME=VALUE, got {text!r}")
    value = yaml.safe_load(raw) if raw.strip() else ""
    return name.strip(), value
