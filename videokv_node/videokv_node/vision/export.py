"""ONNX export of an adapter's whole vision path: the tensor that goes into the LLM.

The graph is ``adapter.vision_forward``: (B, 3, S, S) normalised float32 pixels ->
(B, tokens_per_frame, hidden) float32 embeddings, i.e. vision tower, feature-layer
selection, projector and pooling (LLaVA-OneVision) or patch embedding, window/full
attention blocks and patch merger (Qwen2.5-VL). Preprocessing stays outside (see
``ChatVideoLLMAdapter``). The batch dimension is dynamic where ``adapter.vision_batch`` is
None, else fixed to that many frames.

Choice: the TorchScript-based exporter (``dynamo=False``). It traces the public
transformers forward as is and needs no extra package (the dynamo exporter needs
onnxscript); its output matches PyTorch to 1e-7 on the tiny models (tests). Exports are
float32 whatever the model's dtype: TensorRT lowers precision itself (``--precision``), and
onnxruntime's CPU kernels are float32. Larger than 2 GB (Qwen2.5-VL-7B's tower), the
exporter writes the weights as external data files next to ``model.onnx``; the hash covers them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers

INPUT_NAME = "pixels"
OUTPUT_NAME = "embeds"
OPSET = 17  # LayerNormalization and the ops both towers use; TensorRT 8.6+ and onnxruntime 1.16+ read it
MANIFEST = "export.json"
FORMAT = 1  # bump when the layout of an export directory changes

log = logging.getLogger(__name__)


class VisionGraph(torch.nn.Module):
    """``adapter.vision_forward`` as a module whose parameters are the vision sub-modules only."""

    def __init__(self, adapter) -> None:
        super().__init__()
        self.parts = torch.nn.ModuleList(adapter.vision_modules())  # registered so the exporter sees the weights
        self._forward = adapter.vision_forward

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self._forward(pixels).float()  # float32 out whatever a stray weight promoted it to


@dataclass(frozen=True, slots=True)
class OnnxExport:
    """An exported vision graph on disk and what it takes."""

    path: Path  # model.onnx (external weight files, if any, beside it)
    sha256: str  # over every file of the export directory but the manifest
    input_shape: tuple[int, int, int]  # (3, S, S) per frame
    output_shape: tuple[int, int]  # (T, hidden) per frame
    batch: int | None  # None: dynamic batch; else the graph takes exactly this many frames

    def profile(self, max_batch: int) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(min, opt, max) input shapes of a TensorRT optimisation profile for batches up to ``max_batch``."""
        if self.batch is not None:
            shape = (self.batch, *self.input_shape)
            return shape, shape, shape
        return (1, *self.input_shape), (max_batch, *self.input_shape), (max_batch, *self.input_shape)


def directory_sha256(directory: Path) -> str:
    """sha256 over the names and bytes of every file in ``directory`` (sorted), the manifest excluded."""
    h = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST):
        h.update(str(path.relative_to(directory)).encode() + b"\0")
        with path.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


@torch.inference_mode()
def export_vision_onnx(adapter, directory: str | Path, opset: int = OPSET) -> OnnxExport:
    """Export ``adapter``'s vision path to ``directory``/model.onnx (the directory is replaced atomically).

    The vision modules are cast to float32 for the export and back afterwards (exact for
    float16/bfloat16 weights); the export runs on the model's device.
    """
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    batch = adapter.vision_batch
    example_batch = batch or 2  # > 1 so that the trace never specialises on a batch of one
    pixels = torch.randn(example_batch, *adapter.vision_input_shape, device=adapter.device)
    modules = adapter.vision_modules()
    dtypes = [next(m.parameters()).dtype for m in modules]
    # Weights the forward touches outside ``modules`` (LLaVA's image_newline, dropped again by
    # vision_forward) become graph constants, which the tracer refuses while they require grad.
    grads = {p: p.requires_grad for p in adapter.model.parameters()}
    tmp = Path(tempfile.mkdtemp(prefix=".export-", dir=directory.parent))
    try:
        adapter.model.requires_grad_(False)
        for m in modules:
            m.float()
        graph = VisionGraph(adapter).eval()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer warns on every Python int it freezes: expected here
            torch.onnx.export(
                graph, (pixels,), str(tmp / "model.onnx"), dynamo=False, opset_version=opset,
                input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                dynamic_axes=None if batch else {INPUT_NAME: {0: "batch"}, OUTPUT_NAME: {0: "batch"}},
            )
        out = graph(pixels)  # (b, T, hidden)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        for m, dtype in zip(modules, dtypes):
            m.to(dtype)
        for p, flag in grads.items():
            p.requires_grad_(flag)
    export = OnnxExport(directory / "model.onnx", directory_sha256(tmp), tuple(adapter.vision_input_shape),
                        tuple(out.shape[1:]), batch)
    manifest = {
        "format": FORMAT, "model": adapter.fingerprint(), "opset": opset, "torch": torch.__version__,
        "transformers": transformers.__version__, **{k: v for k, v in asdict(export).items() if k != "path"},
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
    _replace_dir(tmp, directory)
    return export


def _replace_dir(new: Path, target: Path) -> None:
    """Move ``new`` to ``target``; an existing ``target`` is moved aside first and deleted after."""
    old = None
    if target.exists():
        old = target.with_name(f".old-{target.name}-{os.getpid()}")
        os.replace(target, old)
    os.replace(new, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def load_export(directory: str | Path, fingerprint: str) -> OnnxExport | None:
    """The export in ``directory`` if its manifest names this model and this exporter and its files hash
    as recorded; None otherwise (missing, stale or damaged: export again)."""
    directory = Path(directory)
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        export = OnnxExport(directory / "model.onnx", manifest["sha256"], tuple(manifest["input_shape"]),
                            tuple(manifest["output_shape"]), manifest["batch"])
        current = (manifest["format"], manifest["model"], manifest["torch"], manifest["transformers"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if current != (FORMAT, fingerprint, torch.__version__, transformers.__version__):
        return None
    if directory_sha256(directory) != export.sha256:
        log.warning("ONNX export in %s does not match its manifest's hash: exporting again", directory)
        return None
    return export


def ensure_onnx(adapter, cache_dir: str | Path) -> OnnxExport:
    """The adapter's vision export under ``cache_dir``/onnx, exported now if missing, stale or damaged."""
    directory = Path(cache_dir) / "onnx" / f"{adapter.fingerprint()}-{adapter.vision_input_shape[-1]}px"
    export = load_export(directory, adapter.fingerprint())
    if export is None:
        log.info("exporting the vision path of %s to ONNX in %s", adapter.name, directory)
        export = export_vision_onnx(adapter, directory)
    return export
