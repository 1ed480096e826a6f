"""Where blocks live: a resident tier on the model's device and an offload tier in host RAM.

The store enforces nothing by itself about *which* block leaves or which
tokens a compression keeps; that is the policy's call. It guarantees the
bookkeeping: every block is in exactly one tier, entry and byte counts are
exact, and nothing is lost silently (every removal is counted as an eviction).

Counting unit: an *entry* is one token's K and V in one layer. A block
compressed differently per layer costs the sum of what each layer keeps, and
the resident budget of ``budget_tokens`` tokens is ``budget_tokens x n_layers``
entries (sink included), i.e. exactly its bytes.
"""

from __future__ import annotations

import heapq
from collections import Counter, OrderedDict
from collections.abc import Callable, Collection, Iterator

import torch

from videokv_node.memory.store.block import FrameBlock, LayerKV, Tier
from videokv_node.memory.store.block_index import BlockIndex
from videokv_node.memory.store.word_index import WordIndex
from videokv_node.memory.store.host_arena import HostKVArena
from videokv_node.models.adapter import KVGeometry


class BlockStore:
    """Blocks in creation order, across two tiers.

    Invariants: ``blocks()`` iterates in increasing ``block_id``, and so does
    ``blocks(tier)``; a resident block's layers hold tensors and no pages, an
    offloaded block's hold pages and no tensors; no block is empty in every layer
    (it is evicted instead); ``offloaded_bytes <= arena.capacity_bytes``; every
    held block has a slot in ``index`` (``memory/store/block_index.py``), kept in step
    by every mutation here.

    Costs: every query and mutation is O(1) in the number of blocks held, or
    O(the tier it walks) (issue 16: a day-long stream holds thousands of
    blocks, mostly offloaded, and ingest walks only the resident tier).
    """

    def __init__(self, geometry: KVGeometry, device: torch.device, offload_bytes: int, page_tokens: int) -> None:
        self.geometry = geometry
        self.device = device
        # Pageable, not pinned, on any device: pinning would lock all of offload_bytes in RAM at start (a Jetson
        # shares it with the GPU) and gain nothing, as stores copy through pageable memory and loads gather first.
        self.arena = HostKVArena(geometry, offload_bytes, page_tokens) if offload_bytes > 0 else None
        self._blocks: OrderedDict[int, FrameBlock] = OrderedDict()
        self._tiers: dict[Tier, OrderedDict[int, FrameBlock]] = {t: OrderedDict() for t in Tier}  # the same blocks, per tier
        self.index = BlockIndex(geometry, device)
        self.words = WordIndex()  # the blocks by their frames' words (FrameBlock.words)
        # Stamps of the frames held (a summary with no stamp counts none), for the stats' oldest and newest
        # without a walk over memory: counts plus two heaps whose stale tops are dropped lazily.
        self._stamps: Counter[int] = Counter()
        self._stamp_min: list[int] = []
        self._stamp_max: list[int] = []
        self.resident_entries = 0  # (token, layer) entries on the device (the engine adds the sink)
        self.offloaded_entries = 0
        self.evicted_blocks = self.evicted_entries = 0  # lifetime counts, kept across clear()

    # --- queries ----------------------------------------------------------
    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: FrameBlock) -> bool:
        return self._blocks.get(block.block_id) is block

    def blocks(self, tier: Tier | None = None) -> Iterator[FrameBlock]:
        """All blocks (or one tier's) in creation order."""
        return iter(self._blocks.values() if tier is None else self._tiers[tier].values())

    def newest_first(self, tier: Tier) -> Iterator[FrameBlock]:
        """One tier's blocks, newest first (a recent window reads only what it takes)."""
        return reversed(self._tiers[tier].values())

    def count(self, tier: Tier) -> int:
        return len(self._tiers[tier])

    def oldest(self, tier: Tier) -> FrameBlock | None:
        return next(self.blocks(tier), None)

    def stamp_range(self) -> tuple[int, int]:
        """(oldest, newest) stamp of the frames held (a stampless summary cites none); (0, 0) when none."""
        for heap, sign in ((self._stamp_min, 1), (self._stamp_max, -1)):
            while heap and not self._stamps[sign * heap[0]]:
                heapq.heappop(heap)
        if not self._stamp_min:
            return 0, 0
        return self._stamp_min[0], -self._stamp_max[0]

    @property
    def resident_tokens(self) -> float:
        return self.resident_entries / self.geometry.n_layers

    @property
    def offloaded_bytes(self) -> int:
        return 0 if self.arena is None else self.arena.used_pages * self.arena.page_bytes

    def host_arena(self) -> HostKVArena:
        """The offload tier's arena; RuntimeError where there is none (callers hold an offloaded block or checked)."""
        if self.arena is None:
            raise RuntimeError("the store has no host arena (no offload tier, or the engine is closed)")
        return self.arena

    def entry_bytes(self, n_entries: int) -> int:
        return n_entries * self.geometry.bytes_per_token // self.geometry.n_layers

    def layer_kv(self, block: FrameBlock, layer: int, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's (H, t, D) kept K and V of a block: a resident block's own tensors, an offloaded
        block's gathered from the arena onto ``device`` (default: the model's)."""
        kv = block.layers[layer]
        if kv is None:
            raise KeyError(f"block {block.block_id} keeps nothing in layer {layer}")
        if block.tier is Tier.RESIDENT:
            return kv.resident_kv()
        return self.host_arena().load(kv.pages, kv.n_tokens, device or self.device)

    # --- mutations --------------------------------------------------------
    def add(self, block: FrameBlock) -> None:
        """Add a freshly encoded resident block; ids must increase."""
        if block.tier is not Tier.RESIDENT or block.is_empty:
            raise ValueError("new blocks must be resident with their K/V")
        if self._blocks and block.block_id <= next(reversed(self._blocks)):
            raise ValueError("block ids must increase in creation order")
        self._hold(block)
        self.resident_entries += block.entries

    # --- state ------------------------------------------------------------
    def state_dict(self, kv_for: Callable[[list[dict]], Collection[int]] | None = None) -> dict:
        """The blocks' state dicts (creation order) with their K/V, and the lifetime eviction counts.

        Each kept layer gains ``keys`` and ``values`` (H, t, D): a resident block's own tensors
        (by reference), an offloaded block's gathered from the arena onto the host. With
        ``kv_for``, only the blocks whose ids ``kv_for(states)`` names get them (it sees every
        block's state first): an incremental snapshot asks only for what its base lacks.
        """
        states = [b.state_dict() for b in self._blocks.values()]
        wanted = None if kv_for is None else set(kv_for(states))
        for block, state in zip(self._blocks.values(), states):
            if wanted is None or block.block_id in wanted:
                for layer, kv in enumerate(state["layers"]):
                    if kv is not None:
                        kv["keys"], kv["values"] = self.layer_kv(block, layer, torch.device("cpu"))
        return {"blocks": states, "evicted_blocks": self.evicted_blocks, "evicted_entries": self.evicted_entries}

    def load_state_dict(self, state: dict, offload_victim: Callable[["BlockStore"], FrameBlock]) -> None:
        """Replace every block (each in its tier) and the lifetime eviction counts by a ``state_dict``'s.

        ``state["blocks"]``: block state dicts with their K/V, or the blocks already built from
        them (``FrameBlock.from_state_dict``: the engine builds them first, so that a malformed
        one changes nothing). A resident block's K/V go to the device, an offloaded one's into
        arena pages. When the arena cannot hold them all (a smaller ``offload_bytes`` than the
        saved one), ``offload_victim(store)`` picks the offloaded blocks dropped to make room,
        counted as evictions, as a stream would have; a block the arena could never hold is
        evicted. The resident budget is the engine's to enforce afterwards.
        """
        blocks = [b if isinstance(b, FrameBlock) else FrameBlock.from_state_dict(b, self.device) for b in state["blocks"]]
        ids = [b.block_id for b in blocks]
        if ids != sorted(set(ids)) or any(b.is_empty for b in blocks):
            raise ValueError("restored blocks must be non-empty, with increasing ids")
        self.clear()
        self.evicted_blocks, self.evicted_entries = int(state["evicted_blocks"]), int(state["evicted_entries"])
        for block in blocks:
            if block.tier is Tier.RESIDENT:
                self._hold(block)
                self.resident_entries += block.entries
                continue
            staged = [kv for kv in block.layers if kv is not None]
            if not self.can_offload(block):
                self.evicted_blocks += 1
                self.evicted_entries += block.entries
                for kv in staged:
                    kv.keys = kv.values = None
                continue
            while not self.arena_has_room(block):
                self.evict(offload_victim(self))
            for kv in staged:
                kv.pages = self.host_arena().store(*kv.resident_kv())  # staged on the host by from_state_dict
                kv.keys = kv.values = None
            self._hold(block)
            self.offloaded_entries += block.entries

    def keep(self, block: FrameBlock, layer: int, keep: torch.Tensor | None) -> None:
        """Compress: keep only the tokens at positions ``keep`` (ascending, into the layer's
        current tokens) of one layer; ``None`` or empty drops the layer. A block left with no
        layer is evicted (counted)."""
        if block.protected:
            raise ValueError(f"block {block.block_id} ({block.kind}) is protected from compression")
        kv = block.layers[layer]
        if kv is None:
            return
        before = kv.n_tokens
        if keep is None or keep.numel() == 0:
            self._release_layer(block, kv)
            block.layers[layer] = None
            self._count(block, -before)
            self.evicted_entries += before
            if block.is_empty:
                self._drop(block)
                self.evicted_blocks += 1
            else:
                self.index.update_layers(block)
            return
        keep = keep.to("cpu", torch.long)
        if keep.numel() == before:
            return
        if block.tier is Tier.RESIDENT:
            keys, values = kv.resident_kv()
            dev = keep.to(keys.device)
            new = LayerKV(kv.index[keep], kv.logical[:, keep], keys[:, dev].clone(), values[:, dev].clone())
        else:
            k, v = self.layer_kv(block, layer, torch.device("cpu"))  # from the arena
            self.host_arena().free(kv.pages)
            new = LayerKV(kv.index[keep], kv.logical[:, keep], pages=self.host_arena().store(k[:, keep], v[:, keep]))
        block.layers[layer] = new
        self.index.update_layers(block)
        self._count(block, new.n_tokens - before)
        self.evicted_entries += before - new.n_tokens

    def replace_layer(self, block: FrameBlock, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Overwrite a resident protected block's one layer (HERMES' running summary token), same token count."""
        kv = block.layers[layer]
        if block.tier is not Tier.RESIDENT or kv is None or kv.keys is None or keys.shape != kv.keys.shape:
            raise ValueError("replace_layer needs a resident layer of the same shape")
        kv.keys, kv.values = keys, values
        block.revision += 1  # snapshots must write this block's K/V again

    def set_logical(self, block: FrameBlock, layer: int, logical: torch.Tensor) -> None:
        """Move a layer's tokens to new logical positions (HERMES re-indexing); keys stay as stored."""
        kv = block.layers[layer]
        if kv is None or logical.shape != kv.logical.shape:
            raise ValueError("logical positions must match the layer's kept tokens")
        kv.logical = logical

    def pages_needed(self, block: FrameBlock) -> int:
        return sum(self.host_arena().pages_for(kv.n_tokens) for kv in block.layers if kv is not None)

    def can_offload(self, block: FrameBlock) -> bool:
        """Whether the arena could ever hold this block (with every other offloaded block evicted)."""
        return self.arena is not None and self.pages_needed(block) <= self.arena.n_pages

    def arena_has_room(self, block: FrameBlock) -> bool:
        return self.arena is not None and self.arena.can_store(self.pages_needed(block))

    def offload(self, block: FrameBlock) -> None:
        """Move a resident block to the host arena; the caller made room (``arena_has_room``)."""
        if block.tier is not Tier.RESIDENT:
            raise ValueError(f"block {block.block_id} is not resident")
        for kv in block.layers:
            if kv is not None:
                kv.pages = self.host_arena().store(*kv.resident_kv())
                kv.keys = kv.values = None
        n = block.entries
        block.tier = Tier.OFFLOADED
        del self._tiers[Tier.RESIDENT][block.block_id]
        offloaded = self._tiers[Tier.OFFLOADED]
        in_order = not offloaded or next(reversed(offloaded)) < block.block_id
        offloaded[block.block_id] = block
        if not in_order:  # demoted out of creation order (a policy's own victim): re-sort, rare
            self._tiers[Tier.OFFLOADED] = OrderedDict(sorted(offloaded.items()))
        self.index.move(block)
        self.resident_entries -= n
        self.offloaded_entries += n

    def set_rep(self, block: FrameBlock, rep: torch.Tensor) -> None:
        """Set a held block's policy representative (MuKV), in the block and its index slot."""
        block.rep = rep
        self.index.set_rep(block, rep)

    def extend_span(self, block: FrameBlock, end_ns: int, merged: int, end_pose=None) -> None:
        """A held block's still span now ends at ``end_ns`` with ``merged`` frames (memory/frames/still.py),
        in the block and its index slot."""
        block.span_end_ns, block.frames_merged, block.span_end_pose = end_ns, merged, end_pose
        self._index_span(block)

    def _index_span(self, block: FrameBlock) -> None:
        """A one-frame block with a span is in a time window that overlaps the span (it stands for every moment of
        it): its slot's ``stamp_lo``, compared with ``since``, becomes the span's end (``stamp_hi`` stays its stamp)."""
        if block.span_end_ns and len(block.stamps_ns) == 1:
            self.index.stamp_lo[self.index.slot_of[block.block_id]] = block.span_end_ns

    def evict(self, block: FrameBlock) -> None:
        """Remove a block from memory for good, counted."""
        self._drop(block)
        n = block.entries
        self._release(block)
        self.evicted_blocks += 1
        self.evicted_entries += n

    def clear(self) -> None:
        """Forget everything (a reset), not counted as evictions."""
        for block in self._blocks.values():
            self._release(block)
        self._blocks.clear()
        for tier in self._tiers.values():
            tier.clear()
        self.index.clear()
        self.words.clear()
        self._stamps.clear()
        self._stamp_min.clear()
        self._stamp_max.clear()

    def _hold(self, block: FrameBlock) -> None:
        """Enter a block in the store's maps, its index slot and the stamp counts."""
        self._blocks[block.block_id] = block
        self._tiers[block.tier][block.block_id] = block
        self.index.insert(block)
        self.words.add(block)
        self._index_span(block)
        for s in block.cited_stamps:
            if not self._stamps[s]:
                heapq.heappush(self._stamp_min, s)
                heapq.heappush(self._stamp_max, -s)
            self._stamps[s] += 1

    def _drop(self, block: FrameBlock) -> None:
        """Take a block out of the maps, the index and the stamp counts (its K/V are the caller's)."""
        del self._blocks[block.block_id]
        del self._tiers[block.tier][block.block_id]
        self.index.remove(block)
        self.words.remove(block)
        for s in block.cited_stamps:
            self._stamps[s] -= 1
            if not self._stamps[s]:
                del self._stamps[s]
        if max(len(self._stamp_min), len(self._stamp_max)) > 2 * len(self._stamps) + 64:
            # Stale entries sink in a heap where eviction order does not put them on top: rebuild, amortised O(1).
            self._stamp_min = sorted(self._stamps)
            self._stamp_max = sorted(-s for s in self._stamps)

    def _count(self, block: FrameBlock, delta: int) -> None:
        if block.tier is Tier.RESIDENT:
            self.resident_entries += delta
        else:
            self.offloaded_entries += delta

    def _release_layer(self, block: FrameBlock, kv: LayerKV) -> None:
        if block.tier is Tier.RESIDENT:
            kv.keys = kv.values = None
        else:
            self.host_arena().free(kv.pages)
            kv.pages = []

    def _release(self, block: FrameBlock) -> None:
        self._count(block, -block.entries)
        for kv in block.layers:
            if kv is not None:
                self._release_layer(block, kv)
