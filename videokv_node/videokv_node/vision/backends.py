"""Runners of an adapter's vision path: PyTorch, onnxruntime (CPU or CUDA); TensorRT is in ``tensorrt_engine``.

Every backend maps (B, 3, S, S) normalised pixels (``adapter.preprocess``'s output) to
(B, tokens_per_frame, hidden) embeddings; the adapter moves the result to the model's
device and dtype. The interface and the PyTorch runner are on the ground floor
(``videokv_node/vision_backend.py``: model adapters hold them) and re-exported here. A backend
that cannot run here raises ``BackendUnavailable`` from its constructor, with the reason, so
that ``selection`` can log it and try the next one.
"""

from __future__ import annotations

import numpy as np
import torch

from videokv_node.vision.export import OnnxExport
from videokv_node.vision_backend import TorchVisionBackend, VisionBackend

__all__ = ["BackendUnavailable", "OnnxRuntimeVisionBackend", "TorchVisionBackend", "VisionBackend", "onnxruntime_providers"]


class BackendUnavailable(RuntimeError):
    """This backend cannot run here; the message says why (missing package, no GPU, bad engine...)."""


def onnxruntime_providers() -> list[str]:
    """The execution providers of the installed onnxruntime; raises BackendUnavailable without one."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise BackendUnavailable(f"onnxruntime is not installed ({exc})") from exc
    return list(onnxruntime.get_available_providers())


class OnnxRuntimeVisionBackend(VisionBackend):
    """An exported vision graph in onnxruntime: the CUDA provider for a model on a GPU, else the CPU one.

    On CUDA the pixels and the output stay on the GPU (I/O binding to torch's buffers);
    on the CPU they go through numpy without a copy. Float32 in and out: the export is float32.
    """

    def __init__(self, export: OnnxExport, device: torch.device, threads: int = 0) -> None:
        import onnxruntime as ort  # onnxruntime_providers() below says clearly when it is missing

        available = onnxruntime_providers()
        self._device = device
        if device.type == "cuda":
            if "CUDAExecutionProvider" not in available:
                raise BackendUnavailable(f"onnxruntime has no CUDAExecutionProvider (available: {', '.join(available)}); "
                                         "install onnxruntime-gpu")
            providers = [("CUDAExecutionProvider", {"device_id": device.index or 0}), "CPUExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]
        options = ort.SessionOptions()
        if threads > 0:
            options.intra_op_num_threads = threads
        try:
            self.session = ort.InferenceSession(str(export.path), options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own exception types (Fail, InvalidGraph, ...)
            raise BackendUnavailable(f"onnxruntime cannot load {export.path}: {exc}") from exc
        used = self.session.get_providers()[0]
        if device.type == "cuda" and used != "CUDAExecutionProvider":
            # onnxruntime falls back to the CPU silently when the CUDA libraries do not load.
            raise BackendUnavailable(f"onnxruntime's CUDA provider did not load (runs on {used}); check CUDA/cuDNN versions")
        self._input = self.session.get_inputs()[0].name
        self._output = self.session.get_outputs()[0].name
        self._out_tail = export.output_shape  # (T, hidden)
        self.batch = export.batch
        self.name = f"onnxruntime:{used.removesuffix('ExecutionProvider')}"

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        x = pixels.float().contiguous()  # (B, 3, S, S)
        if self._device.type != "cuda":
            return torch.from_numpy(self.session.run([self._output], {self._input: x.cpu().numpy()})[0])
        out = torch.empty((x.shape[0], *self._out_tail), dtype=torch.float32, device=x.device)  # (B, T, hidden)
        binding = self.session.io_binding()
        index = x.device.index or 0
        binding.bind_input(self._input, "cuda", index, np.float32, tuple(x.shape), x.data_ptr())
        binding.bind_output(self._output, "cuda", index, np.float32, tuple(out.shape), out.data_ptr())
        torch.cuda.current_stream(x.device).synchronize()  # preprocessing kernels done before onnxruntime reads
        self.session.run_with_iobinding(binding)
        return out
