"""Validated settings of the vision backend (ROS parameters ``vision.*``, mapped in ``ros/params.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from videokv_node.memory.config import ConfigError

BACKENDS = ("auto", "tensorrt", "onnxruntime", "torch")
PRECISIONS = ("fp16", "fp32", "int8")
REBUILD_MODES = ("auto", "never")
DEFAULT_CACHE_DIR = "~/.cache/videokv/vision"


@dataclass(frozen=True, slots=True)
class VisionConfig:
    """How frames are encoded. Read once at start: a change needs a restart (an engine build may follow)."""

    backend: str = "auto"  # auto (tensorrt, onnxruntime+CUDA, torch on the device), tensorrt, onnxruntime, torch
    cache_dir: str = ""  # ONNX exports and TensorRT engines; "" = ~/.cache/videokv/vision
    precision: str = "fp16"  # TensorRT engine precision: fp16, fp32, or int8 (needs calibration_dir)
    engine_rebuild: str = "auto"  # auto: rebuild a missing, stale or corrupt engine; never: refuse it
    max_batch: int = 8  # frames encoded in one call at most; the TensorRT profile's largest batch
    calibration_dir: str = ""  # int8 only: a directory of RGB frames (.npy uint8 H x W x 3) to calibrate on

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"vision.backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"vision.precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.engine_rebuild not in REBUILD_MODES:
            raise ConfigError(f"vision.engine_rebuild must be one of {REBUILD_MODES}, got {self.engine_rebuild!r}")
        if self.max_batch < 1:
            raise ConfigError(f"vision.max_batch must be >= 1, got {self.max_batch}")
        if self.precision == "int8" and not self.calibration_dir:
            raise ConfigError("vision.precision int8 needs vision.calibration_dir (frames to calibrate on); "
                              "without one use fp16")

    @property
    def cache_path(self) -> Path:
        """The cache directory, ``~`` expanded."""
        return Path(self.cache_dir or DEFAULT_CACHE_DIR).expanduser()
