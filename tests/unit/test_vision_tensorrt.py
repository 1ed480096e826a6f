"""TensorRT for real: build the tiny model's engine, compare with PyTorch, reuse and repair the cache.

Needs the ``tensorrt`` package and a CUDA device; skipped with the reason elsewhere (CI and
the project's CPU machines). The cache logic itself is covered without TensorRT in
test_vision_engine_cache.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from videokv_node.vision.backends import BackendUnavailable

try:
    from videokv_node.vision.tensorrt_engine import import_tensorrt

    import_tensorrt()
    SKIP = "" if torch.cuda.is_available() else "no CUDA device: TensorRT engines need an NVIDIA GPU"
except BackendUnavailable as exc:
    SKIP = str(exc)

pytestmark = pytest.mark.skipif(bool(SKIP), reason=SKIP or "runs")


@pytest.fixture(scope="module")
def adapter():
    from videokv_node.models.llava_onevision import LlavaOnevisionAdapter

    return LlavaOnevisionAdapter.tiny(device="cuda:0")


def frames(n):
    rng = np.random.default_rng(n)
    return [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(n)]


@pytest.mark.parametrize("precision,tol", [("fp32", 1e-3), ("fp16", 2e-2)])
def test_engine_matches_pytorch_for_batches_1_and_3(adapter, tmp_path, precision, tol):
    from videokv_node.vision.config import VisionConfig
    from videokv_node.vision.selection import attach_vision_backend

    torch_backend = adapter.vision_backend
    batch = frames(3)
    reference = adapter.encode_frames(batch).float()
    choice = attach_vision_backend(adapter, VisionConfig(backend="tensorrt", precision=precision, cache_dir=str(tmp_path),
                                                         max_batch=4))
    try:
        assert choice.backend.name == f"tensorrt:{precision}" and choice.backend.cache_event.startswith("built")
        for n in (1, 3):
            torch.testing.assert_close(adapter.encode_frames(batch[:n]).float(), reference[:n], atol=tol, rtol=tol)
    finally:
        adapter.set_vision_backend(torch_backend)


def test_second_start_loads_and_a_corrupt_engine_is_rebuilt(adapter, tmp_path):
    from videokv_node.vision.config import VisionConfig
    from videokv_node.vision.selection import VisionBackendError, attach_vision_backend

    torch_backend = adapter.vision_backend
    config = VisionConfig(backend="tensorrt", precision="fp16", cache_dir=str(tmp_path), max_batch=2)
    try:
        assert attach_vision_backend(adapter, config).backend.cache_event.startswith("built")
        assert attach_vision_backend(adapter, config).backend.cache_event == "loaded"
        (engine,) = (tmp_path / "engines").rglob("engine.plan")
        engine.write_bytes(engine.read_bytes()[:1000])
        never = VisionConfig(backend="tensorrt", precision="fp16", cache_dir=str(tmp_path), max_batch=2,
                             engine_rebuild="never")
        with pytest.raises(VisionBackendError, match="truncated"):
            attach_vision_backend(adapter, never)
        assert "truncated" in attach_vision_backend(adapter, config).backend.cache_event
    finally:
        adapter.set_vision_backend(torch_backend)
