"""ONNX export of the whole vision path: onnxruntime equals PyTorch through ``encode_frames``.

Both adapters' tiny models, frames of mixed sizes (preprocessing stays in torch, so the
graph sees exactly what the PyTorch path sees); one export serves batches of 1 and 3
(LLaVA-OneVision's dynamic batch; Qwen2.5-VL's graph takes one frame per call).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch

from videokv_node.models.llava_onevision import LlavaOnevisionAdapter
from videokv_node.models.qwen2_5_vl import Qwen25VLAdapter
from videokv_node.models.videokv_tiny import VideoKVTinyAdapter
from videokv_node.vision.backends import OnnxRuntimeVisionBackend, TorchVisionBackend
from videokv_node.vision.export import INPUT_NAME, MANIFEST, ensure_onnx, export_vision_onnx, load_export

ADAPTERS = {"llava": LlavaOnevisionAdapter.tiny, "qwen": Qwen25VLAdapter.tiny, "videokv-tiny": VideoKVTinyAdapter.tiny,
            "videokv-tiny-colour": lambda: VideoKVTinyAdapter.tiny(colour_stats=True),  # v4's projector (colour_statistics)
            "videokv-tiny-nouns": lambda: VideoKVTinyAdapter.tiny(colour_stats=True, nouns=True),  # v5's noun block
            "videokv-tiny-things": lambda: VideoKVTinyAdapter.tiny(colour_stats=True, things=True)}  # v6's drawn-things head


def frames(n: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (30 + 11 * i, 44 + 5 * i, 3), dtype=np.uint8) for i in range(n)]


@pytest.fixture(scope="module", params=sorted(ADAPTERS))
def exported(request, tmp_path_factory):
    """(adapter, its export): one export per model for the whole module."""
    adapter = ADAPTERS[request.param]()
    return adapter, ensure_onnx(adapter, tmp_path_factory.mktemp(request.param))


@pytest.mark.parametrize("n", [1, 3])
def test_onnxruntime_equals_pytorch_through_encode_frames(exported, n):
    adapter, export = exported
    batch = frames(n, seed=n)
    reference = adapter.encode_frames(batch)  # PyTorch: the adapter's default backend
    assert isinstance(adapter.vision_backend, TorchVisionBackend)
    torch_backend = adapter.vision_backend
    adapter.set_vision_backend(OnnxRuntimeVisionBackend(export, adapter.device))
    try:
        out = adapter.encode_frames(batch)
    finally:
        adapter.set_vision_backend(torch_backend)
    assert out.shape == (n, adapter.tokens_per_frame, reference.shape[-1]) == reference.shape
    assert out.dtype == reference.dtype and out.device == reference.device
    torch.testing.assert_close(out, reference, atol=1e-4, rtol=0)


def test_one_call_per_frame_batch_matches_the_graph(exported):
    """The exported batch dimension: dynamic for LLaVA-OneVision, fixed to 1 for Qwen2.5-VL."""
    adapter, export = exported
    dims = onnx.load(str(export.path), load_external_data=False).graph.input[0].type.tensor_type.shape.dim
    if adapter.vision_batch is None:
        assert export.batch is None and dims[0].dim_param == "batch"
        ort = OnnxRuntimeVisionBackend(export, adapter.device)
        pixels = adapter.preprocess(frames(3))
        for b in (1, 3):  # one export, two batch sizes, each equal to PyTorch
            reference = adapter.vision_backend.encode(pixels[:b]).float()  # PyTorch
            torch.testing.assert_close(ort.encode(pixels[:b]), reference, atol=1e-4, rtol=0)
    else:
        assert export.batch == 1 and dims[0].dim_value == 1
        assert OnnxRuntimeVisionBackend(export, adapter.device).batch == 1  # encode_frames calls it per frame
    assert [d.dim_value for d in dims[1:]] == list(adapter.vision_input_shape)
    assert export.output_shape == (adapter.tokens_per_frame, adapter.geometry.n_q_heads * adapter.geometry.head_dim)


def test_export_restores_the_model_dtype_and_grad_flags(tmp_path):
    adapter = LlavaOnevisionAdapter.tiny()
    adapter.model.to(torch.float64)
    before = {n: (p.dtype, p.requires_grad) for n, p in adapter.model.named_parameters()}
    export = export_vision_onnx(adapter, tmp_path / "x")
    assert {n: (p.dtype, p.requires_grad) for n, p in adapter.model.named_parameters()} == before
    graph = onnx.load(str(export.path), load_external_data=False).graph
    assert [i.name for i in graph.input] == [INPUT_NAME]
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT  # exports are float32


def test_cached_export_is_reused_and_a_damaged_one_exported_again(tmp_path):
    adapter = LlavaOnevisionAdapter.tiny()
    first = ensure_onnx(adapter, tmp_path)
    mtime = first.path.stat().st_mtime_ns
    assert ensure_onnx(adapter, tmp_path) == first and first.path.stat().st_mtime_ns == mtime
    data = bytearray(first.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    first.path.write_bytes(bytes(data))
    assert load_export(first.path.parent, adapter.fingerprint()) is None
    again = ensure_onnx(adapter, tmp_path)
    assert again.sha256 == first.sha256  # the same model exports to the same bytes
    other = LlavaOnevisionAdapter.tiny(seed=1)
    assert load_export(first.path.parent, other.fingerprint()) is None  # another model never reuses it
    manifest = json.loads((first.path.parent / MANIFEST).read_text())
    assert manifest["model"] == adapter.fingerprint() and manifest["batch"] is None
