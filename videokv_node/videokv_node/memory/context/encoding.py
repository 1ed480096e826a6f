"""What gets encoded: a ``Unit`` (embeddings that become one block) and an ``EncodeJob`` (units
encoded together in one forward pass). Policies make them, the engine runs them."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from videokv_node.memory.store.block import FrameBlock


@dataclass(eq=False, slots=True)
class Unit:
    """Embeddings that become one block when encoded.

    ``offsets`` are its tokens' positions relative to its start ((P, T), min 0);
    the unit after it starts ``span`` positions later.
    """

    feat: torch.Tensor  # (T, hidden) input embeddings
    offsets: torch.Tensor  # (P, T) int64
    camera: str
    stamp_ns: int
    stamps_ns: tuple[int, ...] = ()
    kind: str = "frame"
    rank: int = 0
    protected: bool = False

    @property
    def span(self) -> int:
        return int(self.offsets.max()) + 1


@dataclass(eq=False, slots=True)
class EncodeJob:
    """Units encoded together in one forward pass (causal among themselves), in one stream."""

    units: list[Unit]
    stream: str = "frame"
    # Blocks already encoded that open this job (StreamKV's cached open segment): the units attend to
    # them after the encoding context, and the job's blocks are these followed by the units' blocks.
    ready: list[FrameBlock] = field(default_factory=list)
