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

from videokv_node.config_base import ConfigError, ParamInfo, check_choice, param, param_info
from videokv_node.ingest.pose_history import PoseConfig
from videokv_node.ingest.sampler import SamplerConfig
from videokv_node.memory.config import GenerationConfig, MemoryConfig
from videokv_node.memory.presets import apply_to_parameters
from videokv_node.vision.config import VisionConfig

QOS_PROFILES = ("sensor_data", "reliable", "system_default")


@dataclass(slots=True)
class NodeSettings:
    """What the node itself uses (the rest goes to the library's configs); the model's five also serve the eval CLI."""

    lifecycle: bool = param(False, "start as a managed (lifecycle) node: unconfigured until configure, working only while active")  # read before the node is made
    model: str = param("videokv-tiny", "'tiny' or 'tiny-qwen2.5-vl' (seeded random weights, no files), 'videokv-tiny' (self-trained, weights from installed wheels), or a local LLaVA-OneVision / Qwen2.5-VL checkpoint directory")
    device: str = param("auto", "auto (first CUDA device, else CPU), cpu or cuda:N")
    dtype: str = param("auto", "auto (bf16/fp16 on GPU, fp32 on CPU), float32, float16 or bfloat16")
    seed: int = param(0, "seed of the tiny model's random weights", zero_ok=True)
    torch_threads: int = param(0, "intra-op CPU threads for torch; 0 = torch's default (all cores); limit it on a shared robot CPU", zero_ok=True)
    image_topics: tuple[str, ...] = param(("image",), "sensor_msgs/Image topics, one per camera (remappable)")
    compressed_topics: tuple[str, ...] = param((), "sensor_msgs/CompressedImage topics (topics ending in /compressed are compressed too)")
    camera_qos: str = param("sensor_data", "QoS of camera subscriptions: sensor_data (best effort), reliable or system_default")
    camera_qos_depth: int = param(0, "history depth of camera subscriptions; 0 = the profile's own (sensor_data 5, reliable 10)", zero_ok=True)
    queue_size: int = param(8, "frames waiting for the model worker; the oldest is dropped (and counted) when full")
    max_pending_questions: int = param(4, "questions waiting for the model; more are refused with success=false")
    question_timeout_s: float = param(120.0, "seconds a question may wait and run before it fails", runtime=True)
    stats_period_s: float = param(1.0, "period of ~/memory_stats in seconds (node clock)")
    diagnostics_period_s: float = param(1.0, "period of /diagnostics in seconds (node clock)", runtime=True)
    diagnostics_silence_warn_s: float = param(2.0, "a camera silent longer than this (node clock) is WARN on /diagnostics", runtime=True)
    diagnostics_silence_error_s: float = param(5.0, "a camera silent longer than this (node clock) is ERROR on /diagnostics", runtime=True)
    diagnostics_drop_warn_ratio: float = param(0.10, "memory WARN on /diagnostics above this share of sampled frames dropped from the full queue (ingest behind sample_fps)", runtime=True, fraction=True)

    def __post_init__(self) -> None:
        # ROS parameter files cannot hold an empty string array, so [""] stands for "none".
        self.image_topics = tuple(t for t in self.image_topics if t)
        self.compressed_topics = tuple(t for t in self.compressed_topics if t)
        check_choice("camera_qos", self.camera_qos, QOS_PROFILES)
        if not self.image_topics and not self.compressed_topics:
            raise ConfigError("image_topics and compressed_topics are both empty: nothing to remember")
        if self.queue_size <= 0 or self.max_pending_questions <= 0:
            raise ConfigError("queue_size and max_pending_questions must be > 0")
        if self.question_timeout_s <= 0 or self.stats_period_s <= 0:
            raise ConfigError("question_timeout_s and stats_period_s must be > 0")
        if self.diagnostics_period_s <= 0 or not 0 < self.diagnostics_silence_warn_s <= self.diagnostics_silence_error_s:
            raise ConfigError("need diagnostics_period_s > 0 and 0 < diagnostics_silence_warn_s <= diagnostics_silence_error_s")
        if not 0 <= self.diagnostics_drop_warn_ratio < 1:
            raise ConfigError("diagnostics_drop_warn_ratio must be in [0, 1)")


@dataclass(slots=True)
class SpavaSettings:
    """The node's side of the Spava long-replay service (``ros/long_replay_client.py``)."""

    enabled: bool = param(False, "forward questions whose window reaches beyond memory (or with long_replay set) to the Spava LongReplay service")
    action: str = param("/videokv/long_replay", "name of the Spava service's LongReplay action")
    wait_s: float = param(1.0, "seconds to look for the LongReplay service before answering from memory (and saying so)")
    timeout_s: float = param(600.0, "seconds a forwarded question may take before it fails")
    archive_bytes: int = param(40 << 20, "cap in bytes on the sampled frames kept as JPEG in RAM for the service, oldest dropped first; 0 = none", zero_ok=True)  # ~2,000 384 px frames
    archive_quality: int = param(90, "JPEG quality of the frame archive, 1..100")
    max_send_frames: int = param(256, "frames per LongReplay goal at most, evenly spaced over the question's window")

    def __post_init__(self) -> None:
        if self.wait_s <= 0 or self.timeout_s <= 0:
            raise ConfigError("spava.wait_s and spava.timeout_s must be > 0")
        if self.archive_bytes < 0 or self.max_send_frames < 1:
            raise ConfigError("need spava.archive_bytes >= 0 and spava.max_send_frames >= 1")
        if not 1 <= self.archive_quality <= 100:
            raise ConfigError(f"spava.archive_quality must be in [1, 100], got {self.archive_quality}")
        if not self.action:
            raise ConfigError("spava.action must name the LongReplay action")


@dataclass(frozen=True, slots=True)
class LocateSettings:
    """The ``~/locate`` service (``ros/locate_service.py``)."""

    max_k: int = param(50, "~/locate requests with top_k above this are refused")

    def __post_init__(self) -> None:
        if self.max_k < 1:
            raise ConfigError(f"locate_max_k must be >= 1, got {self.max_k}")


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
)
# The sections an evaluation's engine is built from (the rest is the node's own business).
ENGINE_SECTIONS = ("sampler", "memory", "generation")
# NodeSettings' fields the engine path needs too: which model, where, how.
MODEL_KEYS = ("model", "device", "dtype", "seed", "torch_threads")


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


def model_defaults() -> dict[str, object]:
    """The model parameters' defaults (``model``, ``device``, ...), as the node declares them."""
    defaults = NodeSettings()
    return {key: getattr(defaults, key) for key in MODEL_KEYS}
