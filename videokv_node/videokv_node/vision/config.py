"""Validated settings of the vision backend (ROS parameters ``vision.*``, mapped in ``videokv_node/settings.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from videokv_node.config_base import ConfigError, check_choice, param

BACKENDS = ("auto", "tensorrt", "onnxruntime", "torch")
PRECISIONS = ("fp16", "fp32", "int8")
REBUILD_MODES = ("auto", "never")
DEFAULT_CACHE_DIR = "~/.cache/videokv/vision"


@dataclass(frozen=True, slots=True)
class VisionConfig:
    """How frames are encoded. Read once at start: a change needs a restart (an engine build may follow)."""

    backend: str = param("auto", f"vision encoder backend: {', '.join(BACKENDS)} (auto: TensorRT, then onnxruntime with CUDA, then PyTorch on the model's device)", choices=BACKENDS)
    cache_dir: str = param("", f"directory of ONNX exports and TensorRT engines; empty: {DEFAULT_CACHE_DIR}")
    precision: str = param("fp16", f"TensorRT engine precision: {', '.join(PRECISIONS)} (int8 needs vision.calibration_dir)", choices=PRECISIONS)
    engine_rebuild: str = param("auto", f"{' or '.join(REBUILD_MODES)}: rebuild a missing, stale or corrupt TensorRT engine at start, or refuse it (build ahead with videokv_node.vision.build_engine)", choices=REBUILD_MODES)
    max_batch: int = param(8, "queued frames encoded in one vision call at most; the TensorRT profile's largest batch")
    own_thread: bool = param(False, "run the vision encoder on a thread of its own, on the next queued frames while the decoder encodes the ones before (memory/frames/vision_stage.py); off: one after the other on the model worker (on 2 CPU cores under 8 cameras it gained 0-5%: docs/bench/load.md)")
    calibration_dir: str = param("", "int8 only: directory of .npy RGB uint8 frames to calibrate the TensorRT engine on")  # uint8 H x W x 3 each

    def __post_init__(self) -> None:
        check_choice("vision.backend", self.backend, BACKENDS)
        check_choice("vision.precision", self.precision, PRECISIONS)
        check_choice("vision.engine_rebuild", self.engine_rebuild, REBUILD_MODES)
        if self.max_batch < 1:
            raise ConfigError(f"vision.max_batch must be >= 1, got {self.max_batch}")
        if self.precision == "int8" and not self.calibration_dir:
            raise ConfigError("vision.precision int8 needs vision.calibration_dir (frames to calibrate on); "
                              "without one use fp16")

    @property
    def cache_path(self) -> Path:
        """The cache directory, ``~`` expanded."""
        return Path(self.cache_dir or DEFAULT_CACHE_DIR).expanduser()
