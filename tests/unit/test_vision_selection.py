"""Backend selection: ``auto``'s order with unavailable backends, explicit backends that cannot run,
the real factories on this machine (no TensorRT, no GPU), and batching of frames."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from videokv_node.memory.config import ConfigError
from videokv_node.models.llava_onevision import LlavaOnevisionAdapter
from videokv_node.vision.backends import BackendUnavailable, VisionBackend
from videokv_node.vision.config import VisionConfig
from videokv_node.vision.selection import (
    AUTO_ORDER, VisionBackendError, attach_vision_backend, default_factories, select_backend,
)


class Named(VisionBackend):
    def __init__(self, name: str) -> None:
        self.name = name

    def encode(self, pixels):
        raise AssertionError("not run in selection tests")


def factories(available: set[str], tried: list[str]):
    def make(name):
        def factory():
            tried.append(name)
            if name not in available:
                raise BackendUnavailable(f"{name} missing here")
            return Named(name)
        return factory
    return {name: make(name) for name in AUTO_ORDER}


@pytest.mark.parametrize("available,chosen", [
    ({"tensorrt", "onnxruntime", "torch"}, "tensorrt"),
    ({"onnxruntime", "torch"}, "onnxruntime"),
    ({"torch"}, "torch"),
    ({"tensorrt", "torch"}, "tensorrt"),
])
def test_auto_takes_the_first_available_in_order_and_says_why_it_skipped(available, chosen):
    tried: list[str] = []
    choice = select_backend(VisionConfig(backend="auto"), factories(available, tried))
    assert choice.backend.name == chosen
    assert tried == list(AUTO_ORDER[: AUTO_ORDER.index(chosen) + 1])  # nothing after the winner is even built
    assert [name for name, _ in choice.skipped] == tried[:-1]
    assert all(why == f"{name} missing here" for name, why in choice.skipped)
    for name, why in choice.skipped:
        assert f"skipped {name}: {why}" in choice.describe()


def test_auto_with_nothing_available_is_an_error_listing_every_reason():
    with pytest.raises(VisionBackendError, match="tensorrt: tensorrt missing here; onnxruntime: .*; torch: "):
        select_backend(VisionConfig(), factories(set(), []))


@pytest.mark.parametrize("backend", ["tensorrt", "onnxruntime", "torch"])
def test_an_explicit_backend_that_cannot_run_is_an_error_never_a_fallback(backend):
    tried: list[str] = []
    with pytest.raises(VisionBackendError, match=f"vision.backend {backend} cannot run here: {backend} missing here"):
        select_backend(VisionConfig(backend=backend), factories(set(AUTO_ORDER) - {backend}, tried))
    assert tried == [backend]
    choice = select_backend(VisionConfig(backend=backend), factories({backend}, []))
    assert choice.backend.name == backend and choice.reason == "set by vision.backend"


@pytest.mark.parametrize("kwargs,match", [
    (dict(backend="cuda"), "vision.backend"), (dict(precision="bf16"), "vision.precision"),
    (dict(engine_rebuild="always"), "vision.engine_rebuild"), (dict(max_batch=0), "vision.max_batch"),
    (dict(precision="int8"), "calibration_dir"),
])
def test_bad_settings_say_which(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        VisionConfig(**kwargs)


@pytest.fixture()
def adapter():
    return LlavaOnevisionAdapter.tiny()


def test_real_factories_on_a_cpu_machine(adapter, tmp_path):
    """Here: no TensorRT or no GPU, onnxruntime without CUDA for auto, so auto runs torch on the CPU;
    onnxruntime chosen explicitly runs on the CPU and encodes like torch."""
    config = VisionConfig(cache_dir=str(tmp_path))
    choice = attach_vision_backend(adapter, config)
    assert choice.backend.name == "torch:cpu" and choice.reason == "auto: first available"
    skipped = dict(choice.skipped)
    assert set(skipped) == {"tensorrt", "onnxruntime"}
    assert "CUDA" in skipped["tensorrt"] or "tensorrt" in skipped["tensorrt"]
    assert "only with CUDA" in skipped["onnxruntime"]
    assert not (tmp_path / "onnx").exists()  # nothing exported for backends that were skipped
    frames = [np.full((20, 30, 3), v, dtype=np.uint8) for v in (0, 128, 255)]
    reference = adapter.encode_frames(frames)
    explicit = attach_vision_backend(adapter, VisionConfig(backend="onnxruntime", cache_dir=str(tmp_path)))
    assert explicit.backend.name == "onnxruntime:CPU" and adapter.vision_backend is explicit.backend
    torch.testing.assert_close(adapter.encode_frames(frames), reference, atol=1e-4, rtol=0)
    with pytest.raises(VisionBackendError, match="vision.backend tensorrt cannot run here"):
        attach_vision_backend(adapter, VisionConfig(backend="tensorrt", cache_dir=str(tmp_path)))
    assert adapter.vision_backend is explicit.backend  # a refused choice changes nothing


class Recording(VisionBackend):
    """Runs torch, recording the batch sizes it was given."""

    def __init__(self, adapter) -> None:
        self.inner = default_factories(adapter, VisionConfig(), auto=False)["torch"]()
        self.name = "recording"
        self.batches: list[int] = []

    def encode(self, pixels):
        self.batches.append(pixels.shape[0])
        return self.inner.encode(pixels)


def test_frames_are_encoded_in_batches_of_at_most_max_batch(adapter):
    frames = [np.random.default_rng(i).integers(0, 256, (16, 16, 3), dtype=np.uint8) for i in range(7)]
    reference = adapter.encode_frames(frames)
    recording = Recording(adapter)
    adapter.set_vision_backend(recording, max_batch=3)
    torch.testing.assert_close(adapter.encode_frames(frames), reference, atol=1e-5, rtol=0)
    assert recording.batches == [3, 3, 1]


class ListLogger:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def info(self, message: str) -> None:
        self.lines.append(("info", message))

    def warning(self, message: str) -> None:
        self.lines.append(("warning", message))


def test_the_choice_and_the_export_reach_the_given_logger(adapter, tmp_path):
    logger = ListLogger()
    attach_vision_backend(adapter, VisionConfig(backend="onnxruntime", cache_dir=str(tmp_path)), logger=logger)
    messages = [m for _, m in logger.lines]
    assert any(m.startswith("exporting the vision path") for m in messages)
    assert messages[-1] == "vision backend onnxruntime:CPU (set by vision.backend)"
    before = len(logger.lines)
    attach_vision_backend(adapter, VisionConfig(backend="torch", cache_dir=str(tmp_path)))  # no logger: nothing forwarded
    assert len(logger.lines) == before
