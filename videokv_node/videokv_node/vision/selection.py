"""Picks the vision backend named by ``vision.backend`` and says why.

``auto`` tries, in order: TensorRT, onnxruntime with CUDA, PyTorch on the model's device
(the CPU when the model is there); the first that comes up wins and every earlier one's
reason for being skipped is kept. An explicit backend that cannot run is an error
(``VisionBackendError``) with its reason, never a silent fallback.

``onnxruntime`` chosen explicitly runs on CUDA when the model is on a GPU and the provider
is there, else on the CPU (a model on the CPU); ``auto`` never picks onnxruntime on the
CPU, as the order above says. The factories are injectable so the order is tested without
TensorRT or a GPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from videokv_node.models.factory import ModelLoadError
from videokv_node.vision.backends import BackendUnavailable, OnnxRuntimeVisionBackend, TorchVisionBackend, VisionBackend
from videokv_node.vision.config import VisionConfig

AUTO_ORDER = ("tensorrt", "onnxruntime", "torch")
log = logging.getLogger(__name__)


class VisionBackendError(ModelLoadError):
    """The configured vision backend cannot run here; the message says why. A ModelLoadError: the
    model cannot be set up as configured, and the node refuses to start with the reason."""


@dataclass(frozen=True, slots=True)
class BackendChoice:
    """The backend chosen and the story of the choice, for the node's log and /diagnostics."""

    backend: VisionBackend
    reason: str  # why this one
    skipped: tuple[tuple[str, str], ...] = field(default=())  # (backend, why not), in the order tried

    def describe(self) -> str:
        tried = "".join(f"; skipped {name}: {why}" for name, why in self.skipped)
        return f"vision backend {self.backend.name} ({self.reason}){tried}"


Factory = Callable[[], VisionBackend]


def default_factories(adapter, config: VisionConfig, auto: bool) -> dict[str, Factory]:
    """Backend name -> constructor for ``adapter``; each raises BackendUnavailable with its reason."""
    cache = config.cache_path

    def tensorrt() -> VisionBackend:
        from videokv_node.vision.engine_cache import EngineCacheError
        from videokv_node.vision.tensorrt_engine import TensorRTVisionBackend, calibration_batches, import_tensorrt

        import_tensorrt()  # before exporting: a missing package must not cost an export
        if adapter.device.type != "cuda":
            raise BackendUnavailable(f"TensorRT needs the model on a CUDA device (it is on {adapter.device})")
        export = _export(adapter, cache)
        batch = export.batch or config.max_batch
        try:
            calib = calibration_batches(adapter, config.calibration_dir, batch) if config.precision == "int8" else None
        except EngineCacheError as exc:
            raise BackendUnavailable(str(exc)) from exc
        slot = f"{adapter.fingerprint()}-{adapter.vision_input_shape[-1]}px-{config.precision}"
        return TensorRTVisionBackend(export, adapter.device, cache, config.precision, config.max_batch,
                                     config.engine_rebuild, calib, slot=slot)

    def onnxruntime() -> VisionBackend:
        from videokv_node.vision.backends import onnxruntime_providers

        providers = onnxruntime_providers()
        if auto and (adapter.device.type != "cuda" or "CUDAExecutionProvider" not in providers):
            where = "the model is on the CPU" if adapter.device.type != "cuda" else "no CUDAExecutionProvider"
            raise BackendUnavailable(f"auto uses onnxruntime only with CUDA ({where})")
        return OnnxRuntimeVisionBackend(_export(adapter, cache), adapter.device)

    def torch() -> VisionBackend:
        return TorchVisionBackend(adapter.vision_forward, adapter.vision_dtype, adapter.device)

    return {"tensorrt": tensorrt, "onnxruntime": onnxruntime, "torch": torch}


def _export(adapter, cache):
    """The adapter's ONNX export (made now if needed); a failed export makes the backend unavailable."""
    from videokv_node.vision.export import ensure_onnx

    try:
        return ensure_onnx(adapter, cache)
    except Exception as exc:  # the tracer and onnx raise many types; each means "no graph here"
        raise BackendUnavailable(f"exporting the vision path to ONNX failed ({exc.__class__.__name__}: {exc})") from exc


def select_backend(config: VisionConfig, factories: dict[str, Factory]) -> BackendChoice:
    """The backend ``config.backend`` names (``auto``: the first of AUTO_ORDER that comes up)."""
    if config.backend != "auto":
        try:
            backend = factories[config.backend]()
        except BackendUnavailable as exc:
            raise VisionBackendError(f"vision.backend {config.backend} cannot run here: {exc}") from exc
        return BackendChoice(backend, "set by vision.backend")
    skipped = []
    for name in AUTO_ORDER:
        try:
            backend = factories[name]()
        except BackendUnavailable as exc:
            skipped.append((name, str(exc)))
            continue
        reason = "auto: first available" if skipped else "auto: preferred"
        return BackendChoice(backend, reason, tuple(skipped))
    raise VisionBackendError("no vision backend can run: " + "; ".join(f"{n}: {w}" for n, w in skipped))


class _Forward(logging.Handler):
    """Hands this package's log records to another logger (the node's), INFO and up."""

    def __init__(self, target) -> None:
        super().__init__(logging.INFO)
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        (self.target.warning if record.levelno >= logging.WARNING else self.target.info)(record.getMessage())


def attach_vision_backend(adapter, config: VisionConfig, logger=None) -> BackendChoice:
    """Choose the backend for ``adapter`` as ``config`` says and make the adapter encode through it.

    ``logger`` (anything with ``info`` and ``warning``, e.g. the node's ROS logger) receives,
    while this runs, what the vision package logs: the choice and why earlier backends were
    skipped, an ONNX export, and the notice before a TensorRT build with how long it may take.
    """
    package = logging.getLogger("videokv_node.vision")
    forward = _Forward(logger) if logger is not None else None
    level = package.level
    if forward is not None:
        package.addHandler(forward)
        package.setLevel(logging.INFO)
    try:
        choice = select_backend(config, default_factories(adapter, config, auto=config.backend == "auto"))
        adapter.set_vision_backend(choice.backend, config.max_batch)
        log.info(choice.describe())
    finally:
        if forward is not None:
            package.removeHandler(forward)
            package.setLevel(level)
    return choice
