"""TensorRT: build an engine from the ONNX export with the Python API, and run it on torch's CUDA tensors.

Written against TensorRT 10's name-based API (``set_input_shape``, ``set_tensor_address``,
``execute_async_v3``), which JetPack 6 and the CUDA 12 wheels ship; TensorRT 8.x (JetPack 5)
is refused with that reason. ``tensorrt`` is imported lazily: without it (or without a CUDA
device) ``TensorRTVisionBackend`` raises ``BackendUnavailable`` and the rest of the package works.

Precision: fp16 (default) sets ``BuilderFlag.FP16``, so TensorRT may run layers in fp16
where it is faster, LayerNorm/softmax accumulations stay fp32 as TensorRT decides; int8
sets ``BuilderFlag.INT8`` with an entropy calibrator fed with real frames (``Int8Calibrator``),
the fp16 flag too so layers int8 cannot run fall back to fp16, not fp32.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from videokv_node.vision.backends import BackendUnavailable, VisionBackend
from videokv_node.vision.engine_cache import EngineCache, EngineCacheError, EngineKey
from videokv_node.vision.export import INPUT_NAME, OUTPUT_NAME, OnnxExport

log = logging.getLogger(__name__)
WORKSPACE_BYTES = 2 << 30  # builder scratch memory; 2 GiB fits a Jetson Orin NX 8 GB beside the model
# What to expect, said before a build starts (SigLIP-so400m, fp16, batch profile 1..8):
# minutes on a desktop GPU, a quarter of an hour or more on a Jetson Orin.
BUILD_HINT = "typically 2-10 min on a desktop or data-centre GPU, 10-30 min on a Jetson; int8 calibration adds more"


def import_tensorrt():
    """The ``tensorrt`` module, or BackendUnavailable saying why it cannot be used here."""
    try:
        import tensorrt as trt
    except ImportError as exc:
        raise BackendUnavailable(f"the tensorrt Python package is not installed ({exc}); on a Jetson it comes with "
                                 "JetPack (python3-libnvinfer), elsewhere `pip install tensorrt`") from exc
    except Exception as exc:  # a wheel without its CUDA libraries fails with OSError and friends
        raise BackendUnavailable(f"tensorrt cannot load ({exc.__class__.__name__}: {exc})") from exc
    major = int(trt.__version__.split(".")[0])
    if major < 10:
        raise BackendUnavailable(f"TensorRT {trt.__version__} is too old: the name-based API of TensorRT 10 "
                                 "(JetPack 6) is needed")
    return trt


def engine_key(export: OnnxExport, precision: str, max_batch: int, device: torch.device, trt_version: str) -> EngineKey:
    """The cache key of ``export``'s engine on ``device`` (a CUDA device)."""
    major, minor = torch.cuda.get_device_capability(device)
    return EngineKey(
        onnx_sha256=export.sha256,
        tensorrt_version=trt_version,
        gpu_name=torch.cuda.get_device_name(device),
        compute_capability=f"{major}.{minor}",
        precision=precision,
        profile=export.profile(max_batch),
    )


def _trt_logger(trt):
    """TensorRT's own logger, warnings and errors only (INFO is a page per layer)."""
    return trt.Logger(trt.Logger.WARNING)


def build_serialized_engine(trt, export: OnnxExport, precision: str, max_batch: int,
                            calibration: Iterator[torch.Tensor] | None = None,
                            workspace_bytes: int = WORKSPACE_BYTES) -> bytes:
    """Parse the ONNX file and build a serialised engine with one optimisation profile on the batch."""
    logger = _trt_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(export.path)):  # from the file: external weight data resolves beside it
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineCacheError(f"TensorRT cannot parse {export.path}: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if precision in ("fp16", "int8"):
        config.set_flag(trt.BuilderFlag.FP16)
    if precision == "int8":
        if calibration is None:
            raise EngineCacheError("int8 needs calibration frames (vision.calibration_dir / --calibration-dir)")
        config.set_flag(trt.BuilderFlag.INT8)
        config.int8_calibrator = make_int8_calibrator(trt, calibration, export.profile(max_batch)[1])
    low, opt, high = export.profile(max_batch)
    profile = builder.create_optimization_profile()
    profile.set_shape(INPUT_NAME, low, opt, high)
    config.add_optimization_profile(profile)
    if precision == "int8":
        config.set_calibration_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise EngineCacheError("TensorRT's builder returned no engine (see its log above)")
    return bytes(serialized)


def make_int8_calibrator(trt, batches: Iterator[torch.Tensor], shape: tuple[int, ...]):
    """An entropy calibrator fed with preprocessed (B, 3, S, S) float32 CUDA batches of exactly ``shape``."""

    class Int8Calibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            trt.IInt8EntropyCalibrator2.__init__(self)
            self._batches = batches
            self._current: torch.Tensor | None = None  # kept alive while TensorRT reads it

        def get_batch_size(self) -> int:
            return shape[0]

        def get_batch(self, names):
            batch = next(self._batches, None)
            if batch is None:
                return None
            self._current = batch.float().contiguous()
            return [int(self._current.data_ptr())]

        def read_calibration_cache(self):
            return None  # calibrate afresh: the engine cache already keeps the result

        def write_calibration_cache(self, cache) -> None:
            pass

    return Int8Calibrator()


def calibration_batches(adapter, directory: str | Path, batch: int) -> Iterator[torch.Tensor]:
    """Preprocessed batches of the .npy RGB uint8 frames in ``directory`` (sorted), full batches only.

    The directory is checked now, not when TensorRT first asks for a batch: an error inside
    TensorRT's calibrator callback would surface as a failed build with no reason.
    """
    files = sorted(Path(directory).glob("*.npy"))
    if len(files) < batch:
        raise EngineCacheError(f"int8 calibration needs at least {batch} frames (.npy, H x W x 3 uint8) in {directory}, "
                               f"found {len(files)}")

    def batches() -> Iterator[torch.Tensor]:
        for i in range(0, len(files) - batch + 1, batch):
            yield adapter.preprocess([np.load(f) for f in files[i:i + batch]]).float()  # (batch, 3, S, S)

    return batches()


class TensorRTRunner:
    """A deserialised engine and one execution context; runs on torch's current CUDA stream."""

    def __init__(self, trt, data: bytes, device: torch.device) -> None:
        self._runtime = trt.Runtime(_trt_logger(trt))
        self.engine = self._runtime.deserialize_cuda_engine(data)
        if self.engine is None:
            raise EngineCacheError("TensorRT could not deserialise the engine")
        self.context = self.engine.create_execution_context()
        self.device = device
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        if set(names) != {INPUT_NAME, OUTPUT_NAME}:
            raise EngineCacheError(f"engine tensors {names} are not ({INPUT_NAME}, {OUTPUT_NAME})")

    def run(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) float32 CUDA pixels -> (B, T, hidden) float32 on the same device."""
        x = pixels.float().contiguous()
        self.context.set_input_shape(INPUT_NAME, tuple(x.shape))
        out = torch.empty(tuple(self.context.get_tensor_shape(OUTPUT_NAME)), dtype=torch.float32, device=x.device)
        self.context.set_tensor_address(INPUT_NAME, x.data_ptr())
        self.context.set_tensor_address(OUTPUT_NAME, out.data_ptr())
        stream = torch.cuda.current_stream(x.device)
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execution failed (see its log)")
        stream.synchronize()
        return out


class TensorRTVisionBackend(VisionBackend):
    """The export's engine from the cache (built there if needed and allowed), run on the model's GPU."""

    def __init__(self, export: OnnxExport, device: torch.device, cache_dir: str | Path, precision: str = "fp16",
                 max_batch: int = 8, rebuild: str = "auto", calibration: Iterator[torch.Tensor] | None = None,
                 slot: str | None = None) -> None:
        trt = import_tensorrt()
        if device.type != "cuda" or not torch.cuda.is_available():
            raise BackendUnavailable(f"TensorRT needs the model on a CUDA device (it is on {device})")
        key = engine_key(export, precision, max_batch, device, trt.__version__)
        cache = EngineCache(
            Path(cache_dir) / "engines",
            build=lambda: build_serialized_engine(trt, export, precision, max_batch, calibration),
            deserialize=lambda data: TensorRTRunner(trt, data, device),
            rebuild=rebuild,
            build_hint=BUILD_HINT,
        )
        slot = slot or f"{export.sha256[:16]}-{precision}"
        try:
            self.runner = cache.load_or_build(slot, key)
        except EngineCacheError as exc:
            raise BackendUnavailable(str(exc)) from exc
        self.cache_event = cache.last_event
        self.batch = export.batch
        self.name = f"tensorrt:{precision}"

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.runner.run(pixels)
