"""The resident cache: each layer's placed context (sink + resident blocks) kept in preallocated buffers.

``placed_cache`` rebuilds a context from the blocks every time: it concatenates every block's
keys, re-rotates all of them and concatenates again, for every frame encoded and every question,
though between two steps the resident tier changes by one frame (issue 16). For the policies
whose context is the resident tier itself (``full``, ``hermes``) the engine keeps it here
instead: per layer, K/V buffers sized for the budget (grown by doubling only if a layer ever
needs more), holding the sink and then the blocks at their placed positions, with what stands
where. ``sync`` brings a layer to a new plan (blocks in order, target positions) touching only
what changed:

- a block at the same offset with the same targets is left as it is (a question after an
  ingest: nothing to do; HERMES' lazy layout: only the new frame is written);
- a block whose offset changed (a block before it left) but whose targets did not is moved
  within the buffer, not re-rotated (compaction in place, order kept);
- a block whose targets changed, or a new one, is rotated from its *stored* keys (encoding
  positions) to its targets, exactly as ``place_layer`` does, so rounding never accumulates
  and the buffer equals a from-scratch ``place_layer`` (tests/unit/test_resident_cache.py).

``cache`` returns a ``Cache`` of ``DynamicLayer``s that start as views of the buffers: the decoder's
``update`` concatenates onto them into new tensors (what a plain ``DynamicCache`` prefill
does), so a question or an encoding pass never writes into the buffers.

Cost: a second copy of the resident K/V on the device (the blocks keep theirs at their
encoding positions, which ``offload``, snapshots and other layouts read).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers.cache_utils import Cache, DynamicLayer

from videokv_node.memory.context.retrieval_cache import Sink, Targets, stored_positions
from videokv_node.memory.store.block import FrameBlock
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.models.adapter import VideoLLMAdapter


@dataclass(slots=True)
class _Placed:
    block: FrameBlock  # the block whose one layer's kept tokens stand here
    kv: object  # its LayerKV when written: compression replaces it
    src: torch.Tensor  # that LayerKV's stored keys when written: HERMES' summary token replaces them
    offset: int  # first buffer row
    target: torch.Tensor  # (P, t) positions its keys are rotated at in the buffer


class ResidentCache:
    """Per layer: (1, H, cap, D) K and V buffers, rows [0, S) the sink, then placed blocks in plan order.

    Invariants after ``sync``: layer ``l``'s rows [0, length[l]) equal ``place_layer`` of the last
    plan; ``moved_tokens`` counts the tokens re-rotated by the last ``sync`` (tests, benchmarks).
    """

    def __init__(self, adapter: VideoLLMAdapter, store: BlockStore, sink: Sink, capacity: int) -> None:
        self.adapter, self.store, self.sink = adapter, store, sink
        geo = adapter.geometry
        self.n_layers = geo.n_layers
        S = sink.n_tokens
        cap = max(capacity, S + 1)
        shape = (1, geo.n_kv_heads, cap, geo.head_dim)
        self.keys = [torch.empty(shape, dtype=geo.dtype, device=adapter.device) for _ in range(geo.n_layers)]
        self.values = [torch.empty(shape, dtype=geo.dtype, device=adapter.device) for _ in range(geo.n_layers)]
        for l in range(geo.n_layers):
            self.keys[l][0, :, :S] = sink.keys[l]
            self.values[l][0, :, :S] = sink.values[l]
        self.length = [S] * geo.n_layers
        self.placed: list[list[_Placed]] = [[] for _ in range(geo.n_layers)]
        self.moved_tokens = 0
        self.copied_tokens = 0

    def clear(self) -> None:
        """Forget every block (the sink stays)."""
        self.placed = [[] for _ in range(self.n_layers)]
        self.length = [self.sink.n_tokens] * self.n_layers

    def sync(self, per_layer: Sequence[Sequence[FrameBlock]], targets: Targets) -> None:
        """Make each layer hold the sink then ``per_layer[l]`` at ``targets[l]`` (the ``place_layer`` plan)."""
        self.moved_tokens = self.copied_tokens = 0
        for layer, (blocks, tgts) in enumerate(zip(per_layer, targets)):
            self._sync_layer(layer, blocks, tgts)

    def _sync_layer(self, layer: int, blocks: Sequence[FrameBlock], targets: Sequence[torch.Tensor]) -> None:
        old = {p.block.block_id: p for p in self.placed[layer]}
        k_buf, v_buf = self.keys[layer], self.values[layer]
        at = self.sink.n_tokens
        need = at + sum(t.shape[1] for t in targets)
        if need > k_buf.shape[2]:
            k_buf, v_buf = self._grow(layer, need)
        placed = []
        rotate: list[tuple[FrameBlock, int, torch.Tensor]] = []
        for block, target in zip(blocks, targets):
            kv = block.kept(layer)
            t = kv.n_tokens
            prev = old.get(block.block_id)
            same_tokens = prev is not None and prev.block is block and prev.kv is kv and prev.src is kv.keys
            # Moved down (blocks before it left): copy within the buffer, no rotation. A copy reads rows no
            # earlier step of this sync wrote (they all lie below ``at``); a block moved up is rewritten instead.
            if prev is not None and same_tokens and prev.offset >= at and torch.equal(prev.target, target):
                if prev.offset != at:
                    k_buf[0, :, at : at + t] = k_buf[0, :, prev.offset : prev.offset + t].clone()
                    v_buf[0, :, at : at + t] = v_buf[0, :, prev.offset : prev.offset + t].clone()
                    self.copied_tokens += t
            else:
                rotate.append((block, at, target))
            placed.append(_Placed(block, kv, kv.keys, at, target))
            at += t
        if rotate:
            self._write(layer, rotate)
        self.placed[layer] = placed
        self.length[layer] = at

    def _write(self, layer: int, items: list[tuple[FrameBlock, int, torch.Tensor]]) -> None:
        """Rotate the items' stored keys to their targets (one call for all) and write them at their offsets."""
        kvs = [self.store.layer_kv(block, layer) for block, _, _ in items]  # each (H, t, D)
        stored = torch.cat([stored_positions(block, layer) for block, _, _ in items], dim=1)  # (P, N)
        target = torch.cat([t for _, _, t in items], dim=1)  # (P, N)
        moved = self.adapter.rotate_keys(torch.cat([k for k, _ in kvs], dim=1), target - stored)  # (H, N, D)
        rows = torch.cat([torch.arange(at, at + k.shape[1]) for (_, at, _), (k, _) in zip(items, kvs)]).to(moved.device)
        self.keys[layer][0].index_copy_(1, rows, moved)
        self.values[layer][0].index_copy_(1, rows, torch.cat([v for _, v in kvs], dim=1))
        self.moved_tokens += int(rows.numel())

    def _grow(self, layer: int, need: int) -> tuple[torch.Tensor, torch.Tensor]:
        cap = self.keys[layer].shape[2]
        while cap < need:
            cap *= 2
        for bufs in (self.keys, self.values):
            old = bufs[layer]
            new = torch.empty(old.shape[:2] + (cap,) + old.shape[3:], dtype=old.dtype, device=old.device)
            new[:, :, : self.length[layer]] = old[:, :, : self.length[layer]]
            bufs[layer] = new
        return self.keys[layer], self.values[layer]

    def layer(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(1, H, length, D) views of one layer's placed K and V."""
        n = self.length[layer]
        return self.keys[layer][:, :, :n], self.values[layer][:, :, :n]

    def cache(self, per_layer: Sequence[Sequence[FrameBlock]], targets: Targets) -> Cache:
        """``sync`` to the plan, then a Cache of DynamicLayers over views of the buffers (no copy until the decoder appends)."""
        self.sync(per_layer, targets)
        layers = []
        for l in range(self.n_layers):
            dyn = DynamicLayer()
            keys, values = self.layer(l)
            dyn.lazy_initialization(keys, values)
            dyn.keys, dyn.values = keys, values
            layers.append(dyn)
        # Cache(layers=...): DynamicCache's own constructor would copy every tensor it is given.
        return Cache(layers=layers)
