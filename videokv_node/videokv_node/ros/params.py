"""ROS parameters of the node: declared with descriptors, mapped onto the library's dataclasses here only.

Defaults come from the dataclasses (single source of truth); config/memory.yaml
lists every parameter with a comment, and tests/unit/test_config_yaml.py checks
the two agree. Every parameter is read-only for now: changing a model, budget
or topic at run time needs a restart (runtime changes are a later issue).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.node import Node
from rclpy.parameter import Parameter

from videokv_node.ingest.sampler import SamplerConfig
from videokv_node.memory.config import POLICIES, ConfigError, GenerationConfig, MemoryConfig

QOS_PROFILES = ("sensor_data", "reliable", "system_default")
INT64_MAX = 2**63 - 1


@dataclass(slots=True)
class NodeSettings:
    """What the node itself uses (the rest goes to the library's configs)."""

    model: str = "tiny"  # 'tiny' or a local LLaVA-OneVision checkpoint directory
    device: str = "auto"  # auto, cpu, cuda:N
    dtype: str = "auto"  # auto, float32, float16, bfloat16
    seed: int = 0  # seed of the tiny model's random weights
    torch_threads: int = 0  # intra-op CPU threads for torch; 0 = torch's default (all cores)
    image_topics: tuple[str, ...] = ("image",)  # sensor_msgs/Image topics, one per camera
    compressed_topics: tuple[str, ...] = ()  # topics of sensor_msgs/CompressedImage (also: names ending in /compressed)
    camera_qos: str = "sensor_data"  # QoS of the camera subscriptions
    camera_qos_depth: int = 0  # history depth of the camera subscriptions; 0 = the profile's (5 / 10)
    queue_size: int = 8  # frames waiting for the model; the oldest is dropped when full
    max_pending_questions: int = 4  # questions waiting for the model; more are refused
    question_timeout_s: float = 120.0  # a question not answered by then fails
    stats_period_s: float = 1.0  # period of ~/memory_stats

    def __post_init__(self) -> None:
        # ROS parameter files cannot hold an empty string array, so [""] stands for "none".
        self.image_topics = tuple(t for t in self.image_topics if t)
        self.compressed_topics = tuple(t for t in self.compressed_topics if t)
        if self.camera_qos not in QOS_PROFILES:
            raise ConfigError(f"camera_qos must be one of {QOS_PROFILES}, got {self.camera_qos!r}")
        if not self.image_topics and not self.compressed_topics:
            raise ConfigError("image_topics and compressed_topics are both empty: nothing to remember")
        if self.queue_size <= 0 or self.max_pending_questions <= 0:
            raise ConfigError("queue_size and max_pending_questions must be > 0")
        if self.question_timeout_s <= 0 or self.stats_period_s <= 0:
            raise ConfigError("question_timeout_s and stats_period_s must be > 0")


@dataclass(frozen=True, slots=True)
class Settings:
    node: NodeSettings
    memory: MemoryConfig
    generation: GenerationConfig
    sampler: SamplerConfig


_DESCRIPTIONS = {
    "model": "'tiny' (seeded random weights, no files) or a local LLaVA-OneVision checkpoint directory",
    "device": "auto (first CUDA device, else CPU), cpu or cuda:N",
    "dtype": "auto (bf16/fp16 on GPU, fp32 on CPU), float32, float16 or bfloat16",
    "seed": "seed of the tiny model's random weights",
    "torch_threads": "intra-op CPU threads for torch; 0 = torch's default (all cores); limit it on a shared robot CPU",
    "image_topics": "sensor_msgs/Image topics, one per camera (remappable)",
    "compressed_topics": "sensor_msgs/CompressedImage topics (topics ending in /compressed are compressed too)",
    "camera_qos": "QoS of camera subscriptions: sensor_data (best effort), reliable or system_default",
    "camera_qos_depth": "history depth of camera subscriptions; 0 = the profile's own (sensor_data 5, reliable 10)",
    "queue_size": "frames waiting for the model worker; the oldest is dropped (and counted) when full",
    "max_pending_questions": "questions waiting for the model; more are refused with success=false",
    "question_timeout_s": "seconds a question may wait and run before it fails",
    "stats_period_s": "period of ~/memory_stats in seconds (node clock)",
    "sample_fps": "frames per second per camera entering memory, by header stamp; 0 = every frame",
    "sample_tolerance_s": "slack on the sampling period so camera jitter never skips a sample",
    "sample_reset_backward_s": "a stamp jumping back more than this is a clock reset (bag loop), not a stale frame",
    "memory.policy": f"memory policy: {', '.join(POLICIES)}",
    "memory.budget_tokens": "cap on KV tokens resident on the model's device (prompt sink included)",
    "memory.offload_bytes": "cap on host RAM for offloaded KV blocks, allocated once (rekv)",
    "memory.local_window_tokens": "tokens of recent frames each new frame attends to while encoding",
    "memory.retrieve_frames": "frame blocks retrieved per layer for a question, besides the recent window",
    "memory.page_tokens": "allocation unit of the host arena, in tokens",
    "memory.max_question_tokens": "longer questions are refused",
    "max_new_tokens": "default answer length in tokens when a request gives 0",
    "max_new_tokens_limit": "requests asking for more tokens are refused",
}

# (name prefix, dataclass): a ROS name is prefix + field, unless the field already starts
# with the prefix (SamplerConfig.sample_fps stays ``sample_fps``).
_SECTIONS = (
    ("", NodeSettings),
    ("sample_", SamplerConfig),
    ("memory.", MemoryConfig),
    ("", GenerationConfig),
)


def parameter_table() -> dict[str, tuple[type, str, object]]:
    """ROS name -> (dataclass, field, default), for every parameter the node declares."""
    table = {}
    for prefix, cls in _SECTIONS:
        defaults = cls()
        for f in fields(cls):
            name = f.name if f.name.startswith(prefix) else prefix + f.name
            default = getattr(defaults, f.name)
            table[name] = (cls, f.name, list(default) if isinstance(default, tuple) else default)
    return table


def _descriptor(name: str, default: object) -> ParameterDescriptor:
    d = ParameterDescriptor(description=_DESCRIPTIONS.get(name, name), read_only=True)
    if isinstance(default, bool):
        return d
    if isinstance(default, int):
        lo = 0 if name in ("memory.offload_bytes", "memory.retrieve_frames", "seed", "torch_threads", "camera_qos_depth") else 1
        d.integer_range = [IntegerRange(from_value=lo, to_value=INT64_MAX, step=0)]
    elif isinstance(default, float) and name != "sample_fps":
        d.floating_point_range = [FloatingPointRange(from_value=0.0, to_value=1e9, step=0.0)]
    if isinstance(default, list):
        d.dynamic_typing = False
    return d


def declare_and_read(node: Node) -> Settings:
    """Declare every parameter and build validated settings; raises ConfigError with the bad field."""
    values: dict[type, dict[str, object]] = {cls: {} for _, cls in _SECTIONS}
    for name, (cls, field_name, default) in parameter_table().items():
        if isinstance(default, list):
            param = node.declare_parameter(name, Parameter.Type.STRING_ARRAY, _descriptor(name, default))
            value = tuple(param.value if param.value is not None else default)
        else:
            value = node.declare_parameter(name, default, _descriptor(name, default)).value
        values[cls][field_name] = value
    try:
        return Settings(
            node=NodeSettings(**values[NodeSettings]),
            memory=MemoryConfig(**values[MemoryConfig]),
            generation=GenerationConfig(**values[GenerationConfig]),
            sampler=SamplerConfig(**values[SamplerConfig]),
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc
