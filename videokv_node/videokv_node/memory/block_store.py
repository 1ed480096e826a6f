"""Where frame blocks live: a resident tier on the model's device and an offload tier in host RAM.

The store enforces nothing by itself about *which* block leaves; that is the
policy's call. It guarantees the bookkeeping: every block is in exactly one
tier, byte and token counts are exact, and nothing is lost silently (every
removal is counted as an eviction).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

import torch

from videokv_node.memory.block import FrameBlock, Tier
from videokv_node.memory.host_arena import HostKVArena
from videokv_node.models.adapter import KVGeometry


class BlockStore:
    """Frame blocks in ingest order, across two tiers.

    Invariants: ``blocks()`` iterates in increasing ``block_id`` (ingest order);
    a resident block holds ``keys``/``values`` and no pages; an offloaded block
    holds pages and no tensors; ``offloaded_bytes <= arena.capacity_bytes``.
    """

    def __init__(self, geometry: KVGeometry, device: torch.device, offload_bytes: int, page_tokens: int) -> None:
        self.geometry = geometry
        self.device = device
        pin = device.type == "cuda"
        self.arena = HostKVArena(geometry, offload_bytes, page_tokens, pin_memory=pin) if offload_bytes > 0 else None
        self._blocks: OrderedDict[int, FrameBlock] = OrderedDict()
        self.resident_tokens = 0  # frame tokens on the device (the engine adds the sink)
        self.offloaded_tokens = 0
        self.evicted_blocks = 0  # lifetime count, kept across clear()
        self.evicted_tokens = 0

    # --- queries ----------------------------------------------------------
    def __len__(self) -> int:
        return len(self._blocks)

    def blocks(self, tier: Tier | None = None) -> Iterator[FrameBlock]:
        """All blocks (or one tier's) in ingest order."""
        return (b for b in self._blocks.values() if tier is None or b.tier is tier)

    def oldest(self, tier: Tier) -> FrameBlock | None:
        return next(self.blocks(tier), None)

    @property
    def offloaded_bytes(self) -> int:
        return 0 if self.arena is None else self.arena.used_pages * self.arena.page_bytes

    def block_bytes(self, n_tokens: int) -> int:
        return n_tokens * self.geometry.bytes_per_token

    def layer_kv(self, block: FrameBlock, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's (H, T, D) K and V of a block, on the model's device."""
        if block.tier is Tier.RESIDENT:
            return block.keys[layer], block.values[layer]
        k, v = self.arena.load(block.pages, block.n_tokens, self.device, layer=layer)
        return k, v

    def kv(self, block: FrameBlock) -> tuple[torch.Tensor, torch.Tensor]:
        """All layers' (L, H, T, D) K and V of a block, on the model's device."""
        if block.tier is Tier.RESIDENT:
            return block.keys, block.values
        return self.arena.load(block.pages, block.n_tokens, self.device)

    # --- mutations --------------------------------------------------------
    def add(self, block: FrameBlock) -> None:
        """Add a freshly encoded resident block; ids must increase."""
        if block.tier is not Tier.RESIDENT or block.keys is None:
            raise ValueError("new blocks must be resident with their K/V")
        if self._blocks and block.block_id <= next(reversed(self._blocks)):
            raise ValueError("block ids must increase in ingest order")
        self._blocks[block.block_id] = block
        self.resident_tokens += block.n_tokens

    def can_offload(self, block: FrameBlock) -> bool:
        """Whether the arena could ever hold this block (with every other offloaded block evicted)."""
        return self.arena is not None and self.arena.pages_for(block.n_tokens) <= self.arena.n_pages

    def arena_has_room(self, block: FrameBlock) -> bool:
        return self.arena is not None and self.arena.can_store(block.n_tokens)

    def offload(self, block: FrameBlock) -> None:
        """Move a resident block to the host arena; the caller made room (``arena_has_room``)."""
        if block.tier is not Tier.RESIDENT:
            raise ValueError(f"block {block.block_id} is not resident")
        block.pages = self.arena.store(block.keys, block.values)
        block.keys = block.values = None
        block.tier = Tier.OFFLOADED
        self.resident_tokens -= block.n_tokens
        self.offloaded_tokens += block.n_tokens

    def evict(self, block: FrameBlock) -> None:
        """Remove a block from memory for good, counted."""
        del self._blocks[block.block_id]
        self._release(block)
        self.evicted_blocks += 1
        self.evicted_tokens += block.n_tokens

    def clear(self) -> None:
        """Forget everything (a reset), not counted as evictions."""
        for block in self._blocks.values():
            self._release(block)
        self._blocks.clear()

    def _release(self, block: FrameBlock) -> None:
        if block.tier is Tier.RESIDENT:
            self.resident_tokens -= block.n_tokens
            block.keys = block.values = None
        else:
            self.arena.free(block.pages)
            self.offloaded_tokens -= block.n_tokens
            block.pages = []
