"""What runs an adapter's vision path: the interface, and the PyTorch runner every adapter starts with.

Every backend maps (B, 3, S, S) normalised pixels (``adapter.preprocess``'s output) to
(B, tokens_per_frame, hidden) embeddings; the adapter moves the result to the model's device
and dtype. On the ground floor because both sides name it: a model adapter holds one
(``models/chat_adapter.py``), and ``vision/`` makes the others (``vision/backends.py``:
onnxruntime; ``vision/tensorrt_engine.py``: TensorRT) and picks one (``vision/selection.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch


class VisionBackend(ABC):
    """Encodes normalised pixels; ``name`` says what runs them (``torch:cuda:0``, ``onnxruntime:CPU``...)."""

    name: str
    batch: int | None = None  # frames every call must have (an exported graph with a fixed batch); None: any

    @abstractmethod
    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) pixels on the model's device -> (B, T, hidden), on that device where the backend can."""


class TorchVisionBackend(VisionBackend):
    """The transformers modules themselves, on the model's device, in the vision tower's dtype."""

    def __init__(self, forward: Callable[[torch.Tensor], torch.Tensor], dtype: torch.dtype, device: torch.device) -> None:
        self._forward = forward
        self._dtype = dtype
        self.name = f"torch:{device}"

    @torch.inference_mode()
    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        return self._forward(pixels.to(self._dtype))
