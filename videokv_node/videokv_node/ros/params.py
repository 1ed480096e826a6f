"""ROS parameters of the node: declared with descriptors, mapped onto the library's dataclasses here only.

Defaults come from the dataclasses (single source of truth); a field holding a
dataclass (``MemoryConfig.streamkv``) is a section of its own, its fields the
parameters ``memory.streamkv.<field>``. config/memory.yaml lists every parameter
with a comment, and tests/integration/test_config_files.py checks the two agree.
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

from collections.abc import Iterator
from dataclasses import dataclass, field, fields, is_dataclass

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.exceptions import ParameterException
from rclpy.node import Node
from rclpy.parameter import Parameter

from videokv_node.ingest.pose_history import POSE_SOURCES, POSE_TYPES, PoseConfig
from videokv_node.ingest.sampler import SamplerConfig
from videokv_node.memory.config import (
    OPTION_SCORINGS, POLICIES, PRESETS, QUESTION_STAGES, ConfigError, GenerationConfig, MemoryConfig,
)
from videokv_node.memory.presets import apply_to_parameters, preset_values
from videokv_node.vision.config import BACKENDS, PRECISIONS, REBUILD_MODES, VisionConfig

QOS_PROFILES = ("sensor_data", "reliable", "system_default")
INT64_MAX = 2**63 - 1


@dataclass(slots=True)
class NodeSettings:
    """What the node itself uses (the rest goes to the library's configs)."""

    lifecycle: bool = False  # start as a managed (lifecycle) node, unconfigured; read before the node is made
    model: str = "videokv-tiny"  # 'videokv-tiny' (self-trained, the default), 'tiny', 'tiny-qwen2.5-vl' (random weights) or a local checkpoint directory
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
    diagnostics_period_s: float = 1.0  # period of /diagnostics
    diagnostics_silence_warn_s: float = 2.0  # a camera silent longer than this is WARN on /diagnostics
    diagnostics_silence_error_s: float = 5.0  # ... and longer than this ERROR
    diagnostics_drop_warn_ratio: float = 0.10  # WARN above this share of sampled frames dropped from the full frame queue

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
        if self.diagnostics_period_s <= 0 or not 0 < self.diagnostics_silence_warn_s <= self.diagnostics_silence_error_s:
            raise ConfigError("need diagnostics_period_s > 0 and 0 < diagnostics_silence_warn_s <= diagnostics_silence_error_s")
        if not 0 <= self.diagnostics_drop_warn_ratio < 1:
            raise ConfigError("diagnostics_drop_warn_ratio must be in [0, 1)")


@dataclass(slots=True)
class SpavaSettings:
    """The node's side of the Spava long-replay service (``ros/long_replay_client.py``)."""

    enabled: bool = False  # forward questions reaching beyond memory (or asking long_replay) to the service
    action: str = "/videokv/long_replay"  # name of the service's LongReplay action
    wait_s: float = 1.0  # how long to look for the service before answering from memory instead
    timeout_s: float = 600.0  # a forwarded question not answered by then fails
    archive_bytes: int = 40 << 20  # cap on the sampled frames kept as JPEG in RAM for the service (~2,000 384 px frames); 0 = none
    archive_quality: int = 90  # JPEG quality of the archive, 1..100
    max_send_frames: int = 256  # frames per goal at most, evenly spaced over the question's window

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

    max_k: int = 50  # requests asking for more moments (top_k) are refused

    def __post_init__(self) -> None:
        if self.max_k < 1:
            raise ConfigError(f"locate_max_k must be >= 1, got {self.max_k}")


@dataclass(frozen=True, slots=True)
class Settings:
    node: NodeSettings
    memory: MemoryConfig
    generation: GenerationConfig
    sampler: SamplerConfig
    vision: VisionConfig = VisionConfig()
    spava: SpavaSettings = field(default_factory=SpavaSettings)  # a default: Spava is an optional add-on
    pose: PoseConfig = PoseConfig()  # robot poses stored with the frames (issue 17); off by default
    locate: LocateSettings = LocateSettings()


# Writable at run time. Safe because each is read afresh where used: the sampler's config
# under its lock, the node's timeout per request, the engine's budget, question and
# generation limits on the model thread between two frames (a smaller budget evicts at once),
# the health monitor's thresholds under its lock, the diagnostics timer's period by rcl.
RUNTIME = frozenset({
    "sample_fps", "sample_tolerance_s", "question_timeout_s", "max_new_tokens", "max_new_tokens_limit", "answer.option_scoring",
    "memory.budget_tokens", "memory.max_question_tokens", "memory.retrieve_frames",
    "diagnostics_period_s", "diagnostics_silence_warn_s", "diagnostics_silence_error_s", "diagnostics_drop_warn_ratio",
})

_DESCRIPTIONS = {
    "lifecycle": "start as a managed (lifecycle) node: unconfigured until configure, working only while active",
    "model": "'tiny' or 'tiny-qwen2.5-vl' (seeded random weights, no files), 'videokv-tiny' (self-trained, weights from installed wheels), or a local LLaVA-OneVision / Qwen2.5-VL checkpoint directory",
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
    "diagnostics_period_s": "period of /diagnostics in seconds (node clock)",
    "diagnostics_silence_warn_s": "a camera silent longer than this (node clock) is WARN on /diagnostics",
    "diagnostics_silence_error_s": "a camera silent longer than this (node clock) is ERROR on /diagnostics",
    "diagnostics_drop_warn_ratio": "memory WARN on /diagnostics above this share of sampled frames dropped from the full queue (ingest behind sample_fps)",
    "sample_fps": "frames per second per camera entering memory, by header stamp; 0 = every frame",
    "sample_tolerance_s": "slack on the sampling period so camera jitter never skips a sample",
    "sample_reset_backward_s": "a stamp jumping back more than this is a clock reset (bag loop), not a stale frame",
    "memory.policy": f"memory policy, chosen at start: {', '.join(POLICIES)}",
    "memory.preset": f"defaults of the memory's parameters: {' or '.join(PRESETS)} (robot: memory-conscious; paper: each seed's own values and mechanisms); a parameter set explicitly wins",
    "memory.rekv.query": "ReKV: retrieval query, the mean over the whole prompt's tokens (prompt) or the question's own tokens (question, ReKV's code)",
    "memory.rekv.question_window": "ReKV: a question always attends the recent frames within local_window_tokens besides the retrieved ones (ReKV: off, init tokens + top-k over all blocks)",
    "memory.streamkv.similarity": "StreamKV: adjacent-frame similarity, cosine of the flattened token features (tokens, Eq. 1 as printed) or of their means (mean, StreamKV's code)",
    "memory.hermes.recency_rate_deep": "HERMES: the middle layers' forgetting rate moves linearly from recency_rate to this at the deep end (HERMES' script: 0.5; robot: 20, fixed)",
    "memory.hermes.schedule_end": "HERMES: where the middle layers' depth reaches 1, last_middle (ours) or first_deep (HERMES' script)",
    "memory.hermes.pseudo_queries": "HERMES: probe (pseudo_query read once after the prompt) or live (local/global/mixed queries run through the model over the live cache, HERMES' script)",
    "memory.hermes.local_query": "HERMES live pseudo-queries: the local query; middle layers use 'local; global'",
    "memory.hermes.global_query": "HERMES live pseudo-queries: the global query, scoring deep layers",
    "memory.question_stage": f"question-time stage after the question's prefill: {' or '.join(QUESTION_STAGES)}",
    "memory.budget_tokens": "cap on KV resident on the model's device, prompt sink included, in tokens' worth over all layers (hermes: per layer)",
    "memory.offload_bytes": "cap on host RAM for offloaded KV blocks, allocated once (rekv)",
    "memory.local_window_tokens": "tokens of recent frames each new frame attends to while encoding",
    "memory.retrieve_frames": "rekv: frame blocks retrieved per layer for a question, besides the recent window",
    "memory.page_tokens": "allocation unit of the host arena, in tokens",
    "memory.snapshot_dir": "directory of memory snapshots (~/save_memory, ~/load_memory); empty: snapshots disabled",
    "memory.snapshot_on_shutdown": "snapshot name written when the node shuts down cleanly; empty: none",
    "memory.restore_on_start": "snapshot name loaded at start if present (a bad one is logged, memory starts empty); 'latest': the newest periodic snapshot that passes every check, falling back to older ones; empty: none",
    "memory.snapshot_period_s": "seconds (node clock) between periodic snapshots into memory.snapshot_dir, each writing only what is new; 0: off",
    "memory.snapshot_keep": "periodic snapshots kept, the newest; older ones are deleted after each good write",
    "memory.max_question_tokens": "longer questions are refused",
    "memory.streamkv.similarity_threshold": "StreamKV: adjacent-frame cosine below this starts a segment (paper: 0.99)",
    "memory.streamkv.min_segment_frames": "StreamKV m: segments are at least this many frames (paper: 4)",
    "memory.streamkv.max_segment_frames": "StreamKV M: longer segments merge their most similar adjacent pair (paper: 64)",
    "memory.streamkv.max_segment_s": "StreamKV: an open segment spanning longer than this (stamps) closes at the next frame; 0: no cap (ours, not the paper's)",
    "memory.streamkv.summary_frames": "StreamKV: a summary frame (segment mean) per segment, never compressed (paper: on)",
    "memory.streamkv.compression_ratio": "StreamKV theta: share of a segment's frame blocks dropped per layer, in [0, 1) (paper: 0.6)",
    "memory.streamkv.retrieve_frames": "StreamKV N_r: frame blocks retrieved per layer on average (paper: 8)",
    "memory.streamkv.guidance_prompt": "StreamKV: guidance prompt scoring blocks for compression (paper: its key semantic elements)",
    "memory.hermes.shallow_ratio": "HERMES: share of layers that are sensory memory (paper: 0.1)",
    "memory.hermes.deep_ratio": "HERMES: share of layers that are long-term memory (paper: 0.3)",
    "memory.hermes.recency_rate": "HERMES: forgetting curve exp(-rate * age / oldest age) (HERMES' public script: 20)",
    "memory.hermes.omega0": "HERMES: middle-layer recency weight at the shallow boundary; omega is clamped to [0, 1] (ours: 1.0)",
    "memory.hermes.omega_gamma": "HERMES: omega's decrease to the deep boundary, omega = omega0 - gamma * depth (ours: 1.0)",
    "memory.hermes.smoothing_shallow": "HERMES: cross-layer smoothing lambda in shallow layers (HERMES' public script: 0.1)",
    "memory.hermes.smoothing_middle": "HERMES: cross-layer smoothing lambda in middle layers (HERMES' public script: 0.3)",
    "memory.hermes.smoothing_deep": "HERMES: cross-layer smoothing lambda in deep layers (HERMES' public script: 0.4)",
    "memory.hermes.chunk_frames": "HERMES: frames between compressions; each compression leaves room for the next chunk (paper: 16)",
    "memory.hermes.summary_token": "HERMES: pruned deep-layer tokens folded into one summary token per layer (paper: on)",
    "memory.hermes.reindex": "HERMES: position re-indexing, lazy (streaming, paper's choice) or eager (offline)",
    "memory.hermes.reindex_at": "HERMES lazy re-indexing: when positions pass this share of the model's maximum, in (0, 1] (ours: 0.9)",
    "memory.hermes.pseudo_query": "HERMES: generic question scoring deep and middle layers while streaming (paper 3.3: pseudo query)",
    "memory.mukv.granularities": "MuKV: memories built, a non-empty subset of patch, frame, segment (paper: all three)",
    "memory.mukv.patch_split": "MuKV: a patch block is 1/patch_split of a frame's tokens (paper: 196 / 4 = 49)",
    "memory.mukv.segment_frames": "MuKV: frames per segment block (paper: 4 x 196 = 784 tokens)",
    "memory.mukv.alpha_patch": "MuKV alpha: weight of attention vs FFT energy when compressing patch blocks (paper: 0.5)",
    "memory.mukv.alpha_frame": "MuKV alpha: weight of attention vs FFT energy when compressing frame blocks (paper: 0.7)",
    "memory.mukv.alpha_segment": "MuKV alpha: weight of attention vs FFT energy when compressing segment blocks (paper: 0.8)",
    "memory.mukv.keep_patch": "MuKV rho: share of a patch block's tokens kept, in (0, 1] (paper: 0.1)",
    "memory.mukv.keep_frame": "MuKV rho: share of a frame block's tokens kept, in (0, 1] (paper: 0.1)",
    "memory.mukv.keep_segment": "MuKV rho: share of a segment block's tokens kept, in (0, 1] (paper: 0.8)",
    "memory.mukv.retrieve_patch": "MuKV k: patch blocks retrieved for a question; 0 = none (paper: 20 of 64)",
    "memory.mukv.retrieve_frame": "MuKV k: frame blocks retrieved for a question; 0 = none (paper: 32 of 64)",
    "memory.mukv.retrieve_segment": "MuKV k: segment blocks retrieved for a question; 0 = none (paper: 12 of 64)",
    "memory.mukv.rerank_patch": "MuKV lambda: weight of consistency with the top segments when reranking patches (paper: 0.3)",
    "memory.mukv.rerank_frame": "MuKV lambda: weight of consistency with the top segments when reranking frames (paper: 0.3)",
    "memory.mukv.rerank_segment": "MuKV lambda: weight of consistency with the top segments when reranking segments (paper: 0)",
    "memory.mukv.top_segments": "MuKV: segment candidates whose mean is the rerank centroid (paper: 5)",
    "memory.mukv.over_retrieval": "MuKV: stage 1 keeps over_retrieval x k candidates per granularity (paper: 2)",
    "memory.tgvkv.keep_ratio": "TGV-KV: share of the assembled context's KV kept for decoding, in (0, 1] (paper: 0.05)",
    "vision.backend": f"vision encoder backend: {', '.join(BACKENDS)} (auto: TensorRT, then onnxruntime with CUDA, then PyTorch on the model's device)",
    "vision.cache_dir": "directory of ONNX exports and TensorRT engines; empty: ~/.cache/videokv/vision",
    "vision.precision": f"TensorRT engine precision: {', '.join(PRECISIONS)} (int8 needs vision.calibration_dir)",
    "vision.engine_rebuild": f"{' or '.join(REBUILD_MODES)}: rebuild a missing, stale or corrupt TensorRT engine at start, or refuse it (build ahead with videokv_node.vision.build_engine)",
    "vision.max_batch": "queued frames encoded in one vision call at most; the TensorRT profile's largest batch",
    "vision.calibration_dir": "int8 only: directory of .npy RGB uint8 frames to calibrate the TensorRT engine on",
    "max_new_tokens": "default answer length in tokens when a request gives 0",
    "spava.enabled": "forward questions whose window reaches beyond memory (or with long_replay set) to the Spava LongReplay service",
    "spava.action": "name of the Spava service's LongReplay action",
    "spava.wait_s": "seconds to look for the LongReplay service before answering from memory (and saying so)",
    "spava.timeout_s": "seconds a forwarded question may take before it fails",
    "spava.archive_bytes": "cap in bytes on the sampled frames kept as JPEG in RAM for the service, oldest dropped first; 0 = none",
    "spava.archive_quality": "JPEG quality of the frame archive, 1..100",
    "spava.max_send_frames": "frames per LongReplay goal at most, evenly spaced over the question's window",
    "max_new_tokens_limit": "requests asking for more tokens are refused",
    "pose_topic": "robot pose topic (nav_msgs/Odometry, geometry_msgs/PoseStamped or PoseWithCovarianceStamped); each sampled frame stores the pose interpolated at its stamp; empty: no poses",
    "pose_type": f"message type of pose_topic: {', '.join(POSE_TYPES)} (auto: as the topic graph shows it; the subscription waits until the topic appears)",
    "pose_source": f"where poses come from: {' or '.join(POSE_SOURCES)} (tf: the transform pose_frame <- base_frame at each frame's stamp; needs tf2_ros, i.e. ROS 2 from apt)",
    "pose_frame": "pose_source tf: the fixed frame poses are expressed in",
    "base_frame": "pose_source tf: the robot frame whose pose is stored",
    "pose_tolerance_s": "a frame at most this far before the oldest or after the newest pose gets that pose; further out it gets none (counted)",
    "pose_history_size": "poses kept to interpolate frames' poses from (a frame older than the oldest gets none)",
    "pose_reset_backward_s": "a pose stamp jumping back more than this restarts the pose history (clock reset); smaller jumps back are dropped and counted",
    "locate_max_k": "~/locate requests with top_k above this are refused",
    "answer.option_scoring": f"multiple choice: {' or '.join(OPTION_SCORINGS)} (likelihood: each option's text scored as the answer, mean log-probability per token, softmax; letter: the option letters' logits)",
}

# (Settings field, name prefix, dataclass): a ROS name is prefix + field, unless the field
# already starts with the prefix (SamplerConfig.sample_fps stays ``sample_fps``).
_SECTIONS = (
    ("node", "", NodeSettings),
    ("sampler", "sample_", SamplerConfig),
    ("memory", "memory.", MemoryConfig),
    ("generation", "", GenerationConfig),
    ("vision", "vision.", VisionConfig),
    ("spava", "spava.", SpavaSettings),
    ("pose", "", PoseConfig),
    ("locate", "locate_", LocateSettings),
)

# Integer parameters for which 0 is meaningful ("none", "default" or "off"); every other
# integer must be >= 1.
_ZERO_OK = frozenset({
    "seed", "torch_threads", "camera_qos_depth", "memory.offload_bytes", "memory.retrieve_frames", "spava.archive_bytes",
    "memory.mukv.retrieve_patch", "memory.mukv.retrieve_frame", "memory.mukv.retrieve_segment",
})
# Doubles with no range: negative values mean something (sample_fps <= 0: every frame) or
# are clamped where used (HERMES' omega).
_UNBOUNDED = frozenset({"sample_fps", "memory.hermes.omega0", "memory.hermes.omega_gamma"})
# The (preset, policy) each node's parameter defaults were declared for (see ``declare``).
_DECLARED_FOR: "weakref.WeakKeyDictionary[Node, tuple[str, str]]" = weakref.WeakKeyDictionary()
# Doubles that the dataclasses check are shares in [0, 1] (some exclude one end; the dataclass says so).
_FRACTIONS = frozenset({
    "diagnostics_drop_warn_ratio",
    "memory.streamkv.similarity_threshold", "memory.streamkv.compression_ratio",
    "memory.hermes.shallow_ratio", "memory.hermes.deep_ratio", "memory.hermes.reindex_at",
    "memory.hermes.smoothing_shallow", "memory.hermes.smoothing_middle", "memory.hermes.smoothing_deep",
    *(f"memory.mukv.{kind}_{g}" for kind in ("alpha", "keep", "rerank") for g in ("patch", "frame", "segment")),
    "memory.tgvkv.keep_ratio",
})


def _ros_name(prefix: str, field_name: str) -> str:
    return field_name if field_name.startswith(prefix) else prefix + field_name


def _leaves(prefix: str, cls: type) -> Iterator[tuple[str, type, str, object]]:
    """(ROS name, dataclass, field, default) of every non-dataclass field of cls, nested sections flattened."""
    defaults = cls()
    for f in fields(cls):
        name, default = _ros_name(prefix, f.name), getattr(defaults, f.name)
        if is_dataclass(default):
            yield from _leaves(name + ".", type(default))
        else:
            yield name, cls, f.name, list(default) if isinstance(default, tuple) else default


def _build(prefix: str, cls: type, values: dict[str, object]) -> object:
    """cls from the declared values, nested sections built first (each validates itself)."""
    defaults = cls()
    kwargs = {}
    for f in fields(cls):
        name, default = _ros_name(prefix, f.name), getattr(defaults, f.name)
        kwargs[f.name] = _build(name + ".", type(default), values) if is_dataclass(default) else values[name]
    return cls(**kwargs)


def parameter_table() -> dict[str, tuple[type, str, object]]:
    """ROS name -> (dataclass holding the field, field, default), for every parameter the node declares."""
    return {name: (cls, field_name, default) for _, prefix, section in _SECTIONS
            for name, cls, field_name, default in _leaves(prefix, section)}


def _descriptor(name: str, default: object, lifecycle: bool = False) -> ParameterDescriptor:
    writable = name in RUNTIME
    if writable:
        suffix = " (writable at run time)"
    elif lifecycle and name != "lifecycle":
        suffix = " (writable while unconfigured; read at configure)"
    else:
        suffix = " (read-only: a change needs a restart)"
    d = ParameterDescriptor(description=_DESCRIPTIONS.get(name, name) + suffix,
                            read_only=not (writable or suffix.startswith(" (writable while unconfigured")))
    if isinstance(default, bool):
        return d
    if isinstance(default, int):
        lo = 0 if name in _ZERO_OK else 1
        d.integer_range = [IntegerRange(from_value=lo, to_value=INT64_MAX, step=0)]
    elif isinstance(default, float) and name not in _UNBOUNDED:
        hi = 1.0 if name in _FRACTIONS else 1e9
        d.floating_point_range = [FloatingPointRange(from_value=0.0, to_value=hi, step=0.0)]
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
    default is then the preset's value for that policy (``memory/presets.py``), so a value
    given to the node wins over the preset and ``ros2 param get`` shows what is in force.
    """
    table = parameter_table()
    first = {}
    for name in ("memory.preset", "memory.policy"):  # read first: they choose the others' defaults
        _declare_one(node, name, table[name][2], lifecycle)
        first[name] = node.get_parameter(name).value
    defaults = apply_to_parameters(first, {name: default for name, (_, _, default) in table.items()})
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
    for name, (_, _, default) in parameter_table().items():
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
    return _settings(values)


def _settings(values: dict[str, object]) -> Settings:
    try:
        return Settings(**{attr: _build(prefix, cls, values) for attr, prefix, cls in _SECTIONS})
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc
