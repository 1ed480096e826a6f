"""A frame block: the KV entries of one frame, the unit the memory keeps or drops."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import torch


class Tier(Enum):
    RESIDENT = "resident"  # K/V tensors on the model's device
    OFFLOADED = "offloaded"  # K/V in pages of the host arena


@dataclass(eq=False, slots=True)
class FrameBlock:
    """One frame's KV over all layers, with what is needed to move and score it.

    ``positions`` are the positions the keys are rotated at (set once at
    encoding, never changed: moving a block rotates a *copy*, so rounding never
    accumulates). ``key_mean`` is the mean pre-RoPE key per layer and head, the
    block's representative for retrieval; it stays on the host whatever the tier.
    """

    block_id: int  # strictly increasing in ingest order; set by the engine
    camera: str  # topic name of the camera
    stamp_ns: int  # header stamp of the frame
    positions: torch.Tensor  # (T,) int64, on the host
    key_mean: torch.Tensor  # (L, H_kv, D) float32, on the host
    tier: Tier = Tier.RESIDENT  # changed only by BlockStore
    keys: torch.Tensor | None = None  # (L, H_kv, T, D) when resident; changed only by BlockStore
    values: torch.Tensor | None = None  # (L, H_kv, T, D) when resident; changed only by BlockStore
    pages: list[int] = field(default_factory=list)  # host arena pages when offloaded; BlockStore only

    @property
    def n_tokens(self) -> int:
        return int(self.positions.numel())
