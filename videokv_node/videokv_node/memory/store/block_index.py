"""The retrieval index: every held block's representatives in preallocated tensors, a slot per block.

A question must not restack N blocks' mean keys, nor walk N blocks in Python, to score
them (issue 16): a robot that runs all day holds thousands of blocks. So the block
store keeps, next to the blocks, one row ("slot") per block in tensors on the model's
device: its mean pre-RoPE key per layer (ReKV's and StreamKV's representative), its
policy representative (MuKV's ``rep``), which layers it keeps, its tier, stream,
camera and stamp range. A slot is filled when the block enters the store, updated when
a layer is compressed away or the block is demoted (its tier mark moves), and freed
when the block leaves; freed slots are reused, and the tensors grow by doubling only
when every slot is taken, so the index costs O(1) per change and its footprint follows
what memory holds.

A question then builds its candidate set as one boolean mask (camera, time window),
scores every slot with one matrix product per layer and takes top-k on the device;
Python touches only the k blocks picked. Selection semantics are the policies' own:
candidates are ordered by block id (creation order, the order ``BlockStore.blocks()``
gives), and the tie rules of ``scoring/rekv.py`` ``top_k_blocks`` and ``select_kv`` hold.

Creation order is kept, not recomputed (issue 16): an order tensor lists the slots in the
order their blocks entered, a freed slot's entry is marked dead where it stands and the
tensor is compacted once the dead outnumber the living, so a question reads the held slots
in creation order with one masked copy instead of an argsort of their ids. A block entered
out of id order (a snapshot restored in another order) is sorted in at the next read, once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from videokv_node.memory.scoring.contrast import temporal_contrast
from videokv_node.memory.scoring.rekv import block_scores, fused_ranks
from videokv_node.memory.scoring.top_k import top_k_masked
from videokv_node.memory.store.block import FrameBlock, Tier, newest_within
from videokv_node.models.adapter import KVGeometry

TIER_CODE = {Tier.RESIDENT: 0, Tier.OFFLOADED: 1}
NO_STAMP = torch.iinfo(torch.int64).max


class BlockIndex:
    """Slots of block representatives, kept by ``BlockStore`` in step with its blocks.

    Invariants: a block is in the store iff it holds a slot (``slot_of``); a free slot has
    block id -1 and is in no mask; ``blocks[slot]`` is the block a slot holds; ``present``
    says which layers keep tokens, ``tokens`` how many; every tensor has ``capacity`` rows;
    ``ordered()`` lists every held slot exactly once, by increasing block id.
    """

    def __init__(self, geometry: KVGeometry, device: torch.device, capacity: int = 64) -> None:
        self.n_layers, self.n_heads, self.head_dim = geometry.n_layers, geometry.n_kv_heads, geometry.head_dim
        self.device = device
        self.capacity = 0
        self.key_mean = torch.zeros(self.n_layers, 0, self.n_heads, self.head_dim, device=device)  # (L, C, H, D) float32
        self.rep: torch.Tensor | None = None  # (C, R) float32: policy representatives, allocated on first use
        self.block_id = torch.zeros(0, dtype=torch.long, device=device)  # (C,) -1 when free
        self.tier = torch.zeros(0, dtype=torch.int8, device=device)  # (C,) TIER_CODE
        self.stream = torch.zeros(0, dtype=torch.long, device=device)  # (C,) code in ``_codes``
        self.camera = torch.zeros(0, dtype=torch.long, device=device)  # (C,) code in ``_codes``
        self.stamp_lo = torch.zeros(0, dtype=torch.long, device=device)  # (C,) oldest stamp the block represents (a one-frame still span: its end, BlockStore._index_span)
        self.stamp_hi = torch.zeros(0, dtype=torch.long, device=device)  # (C,) newest
        self.present = torch.zeros(0, self.n_layers, dtype=torch.bool, device=device)  # (C, L)
        self.tokens = torch.zeros(0, self.n_layers, dtype=torch.long, device=device)  # (C, L) kept tokens
        self.encoded = torch.zeros(0, dtype=torch.long, device=device)  # (C,) tokens encoded (FrameBlock.n_tokens)
        self.blocks: list[FrameBlock | None] = []  # slot -> block
        self.slot_of: dict[int, int] = {}  # block id -> slot
        self._free: list[int] = []  # a stack of free slots
        self._codes: dict[str, int] = {}  # camera / stream names -> codes (never forgotten: a handful)
        # Creation order (``ordered``): ``_order[:_order_n]`` are slots in the order their blocks were
        # inserted; ``_order_live[i]`` is False once entry i's block left (its slot may hold another
        # block by then, entered again at the end); ``_pos[slot]`` is the slot's live entry. Changed
        # only by insert / remove / clear.
        self._order = torch.zeros(0, dtype=torch.long, device=device)  # (capacity of the order,) slots
        self._order_live = torch.zeros(0, dtype=torch.bool, device=device)  # (same,)
        self._order_n = 0  # entries used, live or dead
        self._dead = 0  # dead entries among them
        self._pos = torch.zeros(0, dtype=torch.long, device=device)  # (C,) slot -> its live entry
        self._last_id = -1  # the highest block id entered since the order was last sorted
        self._sorted = True  # False once a block entered below ``_last_id``: sorted at the next read
        self._ordered: torch.Tensor | None = None  # (N,) the live slots in creation order, until a change
        self._grow(capacity)

    def __len__(self) -> int:
        return len(self.slot_of)

    # --- changes (BlockStore calls these) ------------------------------------
    def insert(self, block: FrameBlock) -> None:
        """Give ``block`` a slot and fill it (mean keys, rep, layers, tier, stream, camera, stamps)."""
        if block.block_id in self.slot_of:
            raise ValueError(f"block {block.block_id} is already indexed")
        if not self._free:
            self._grow(2 * self.capacity)
        slot = self._free.pop()
        self.slot_of[block.block_id] = slot
        self.blocks[slot] = block
        self.key_mean[:, slot] = block.key_mean.to(self.device, torch.float32)
        self.block_id[slot] = block.block_id
        self.tier[slot] = TIER_CODE[block.tier]
        self.stream[slot] = self.code(block.stream)
        self.camera[slot] = self.code(block.camera)
        self.stamp_lo[slot] = min(block.stamps_ns)
        self.stamp_hi[slot] = max(block.stamps_ns)
        self.encoded[slot] = block.n_tokens
        self.update_layers(block)
        if block.rep is not None:
            self.set_rep(block, block.rep)
        self._enter(slot, block.block_id)

    def remove(self, block: FrameBlock) -> None:
        """Free the block's slot (evicted, or compressed away in every layer)."""
        slot = self.slot_of.pop(block.block_id)
        self.blocks[slot] = None
        self.block_id[slot] = -1
        self.present[slot] = False
        self.tokens[slot] = 0
        self._free.append(slot)
        self._order_live[self._pos[slot]] = False
        self._dead += 1
        self._ordered = None
        if self._dead > max(64, self._order_n - self._dead):  # amortised O(1) per removal
            self._compact()

    def move(self, block: FrameBlock) -> None:
        """The block changed tier (demotion): its slot's tier mark follows."""
        self.tier[self.slot_of[block.block_id]] = TIER_CODE[block.tier]

    def update_layers(self, block: FrameBlock) -> None:
        """The block's kept layers or token counts changed (compression): refresh its slot."""
        slot = self.slot_of[block.block_id]
        counts = [0 if kv is None else kv.n_tokens for kv in block.layers]
        self.tokens[slot] = torch.tensor(counts, dtype=torch.long)
        self.present[slot] = self.tokens[slot] > 0

    def set_rep(self, block: FrameBlock, rep: torch.Tensor) -> None:
        """Store a policy representative (same size for every block that has one)."""
        rep = rep.reshape(-1).to(self.device, torch.float32)
        if self.rep is None or self.rep.shape[1] != rep.numel():
            if self.rep is not None and len(self):
                raise ValueError(f"representatives are {self.rep.shape[1]} wide, got {rep.numel()}")
            self.rep = torch.zeros(self.capacity, rep.numel(), device=self.device)
        self.rep[self.slot_of[block.block_id]] = rep

    def clear(self) -> None:
        for block in [b for b in self.blocks if b is not None]:
            self.remove(block)
        self._order_live[: self._order_n] = False
        self._order_n = self._dead = 0
        self._last_id, self._sorted, self._ordered = -1, True, None

    def _enter(self, slot: int, block_id: int) -> None:
        """Append ``slot`` to the creation order (its block was just inserted)."""
        if self._order_n == self._order.numel():
            if self._dead:
                self._compact()
            if self._order_n == self._order.numel():
                extra = max(self._order.numel(), 64)
                self._order = torch.cat([self._order, self._order.new_zeros(extra)])
                self._order_live = torch.cat([self._order_live, self._order_live.new_zeros(extra)])
        n = self._order_n
        self._order[n] = slot
        self._order_live[n] = True
        self._pos[slot] = n
        self._order_n += 1
        if block_id < self._last_id:
            self._sorted = False
        self._last_id = max(self._last_id, block_id)
        self._ordered = None

    def _live(self) -> torch.Tensor:
        """(N,) the live entries of the creation order, in entry order."""
        return torch.masked_select(self._order[: self._order_n], self._order_live[: self._order_n])

    def _compact(self, live: torch.Tensor | None = None) -> None:
        """The creation order rewritten as ``live`` (default: its live entries, in place order), no dead ones."""
        live = self._live() if live is None else live
        n = live.numel()
        self._order[:n] = live
        self._order_live[:n] = True
        self._order_live[n:] = False
        self._pos[live] = torch.arange(n, device=self.device)
        self._order_n, self._dead = n, 0

    def ordered(self) -> torch.Tensor:
        """(N,) the slots of every held block in creation order (increasing block id); O(N), no sort.

        The same tensor is returned until the index changes; callers must not write to it.
        """
        if self._ordered is None:
            live = self._live()
            if not self._sorted:  # a block entered out of id order: sort once, then keep appending
                live = live[torch.argsort(self.block_id[live])]
                self._compact(live)
                self._sorted = True
            self._ordered = live
        return self._ordered

    def code(self, name: str) -> int:
        return self._codes.setdefault(name, len(self._codes))

    def _grow(self, capacity: int) -> None:
        capacity = max(capacity, 1)
        extra = capacity - self.capacity
        if extra <= 0:
            return

        def pad(t: torch.Tensor, dim: int = 0, value=0) -> torch.Tensor:
            shape = list(t.shape)
            shape[dim] = extra
            return torch.cat([t, torch.full(shape, value, dtype=t.dtype, device=t.device)], dim=dim)

        self.key_mean = pad(self.key_mean, dim=1)
        self.rep = None if self.rep is None else pad(self.rep)
        self.block_id = pad(self.block_id, value=-1)
        self.tier, self.stream, self.camera = pad(self.tier), pad(self.stream), pad(self.camera)
        self.stamp_lo, self.stamp_hi = pad(self.stamp_lo), pad(self.stamp_hi)
        self.present, self.tokens, self.encoded = pad(self.present), pad(self.tokens), pad(self.encoded)
        self._pos = pad(self._pos)
        self.blocks += [None] * extra
        self._free = list(range(capacity - 1, self.capacity - 1, -1)) + self._free  # lowest new slot on top
        self.capacity = capacity

    # --- queries --------------------------------------------------------------
    def held(self) -> torch.Tensor:
        """(C,) bool: slots holding a block."""
        return self.block_id >= 0

    def candidate_mask(self, cameras: Sequence[str] = (), since_ns: int = 0, until_ns: int = 0) -> torch.Tensor:
        """(C,) bool: blocks of ``cameras`` (all when empty) whose frames all lie in [since, until] (until 0: open)."""
        mask = self.held() & (self.stamp_lo >= since_ns)
        if until_ns:
            mask &= self.stamp_hi <= until_ns
        if cameras:
            codes = [self._codes[c] for c in cameras if c in self._codes]
            mask &= torch.isin(self.camera, torch.tensor(codes, dtype=torch.long, device=self.device))
        return mask

    def blocks_of(self, slots: torch.Tensor) -> list[FrameBlock]:
        """The blocks of ``slots`` ((n,) long), in that order."""
        return [self.blocks[s] for s in slots.tolist()]

    def by_age(self, mask: torch.Tensor) -> torch.Tensor:
        """(n,) the slots of ``mask`` in creation order (increasing block id): a masked copy of ``ordered``."""
        order = self.ordered()
        return torch.masked_select(order, mask.index_select(0, order))

    def newest(self, mask: torch.Tensor, n: int) -> torch.Tensor:
        """(min(n, count),) the slots of the ``n`` newest blocks of ``mask``, newest first."""
        ids = torch.where(mask, self.block_id, torch.full_like(self.block_id, -1))
        n = min(n, int(mask.sum()))
        return torch.topk(ids, n).indices if n else ids.new_zeros(0)

    def top_k(self, query_mean: torch.Tensor, layer: int, mask: torch.Tensor, k: int) -> torch.Tensor:
        """The slots of the ``k`` best blocks of ``mask`` for one layer (any order).

        Score: ReKV's, ``scoring/rekv.py`` ``block_scores``, over every slot in one product; ties at
        the cut go to the newer block, as in ``top_k_blocks`` there.
        query_mean: (H, D).
        """
        return top_k_masked(block_scores(query_mean, self.key_mean[layer]), mask, self.block_id, k)

    def fused_top_k(self, query_means: torch.Tensor, mask: torch.Tensor, k: int, contrast: int = 0) -> torch.Tensor:
        """The slots of the ``k`` best blocks of ``mask`` for all layers at once, best first.

        Each layer scores the blocks of ``mask`` as ``top_k`` does (query_means[l]: that layer's
        (H, D) query; ``contrast`` w > 0: against ``contrasted_key_means``, ``memory.rekv.contrast``)
        and ranks them from 0 (the best; equal scores: the newer block first, a
        layer where a block keeps no tokens ranks it after all that keep some); a block's fused
        score is the mean over the layers of 1 / (1 + its rank) (reciprocal-rank fusion with no
        offset: ``memory.rekv.selection: shared``). Top-k of the fused score, ties to the newer
        block (the order of equal fused scores too). One batched product and one sort per layer.
        """
        slots = mask.nonzero().flatten()
        if min(k, n := slots.numel()) == 0:
            return self.block_id.new_zeros(0)
        L = self.n_layers
        ids = self.block_id.index_select(0, slots)
        keys = self.contrasted_key_means(slots, contrast).reshape(L, n, -1)  # (L, n, H * D); contrast 0: as held
        scores = torch.bmm(keys, query_means.to(keys).reshape(L, -1, 1)).squeeze(2)  # (L, n); the scale ranks nothing
        scores = scores.masked_fill(~self.present.index_select(0, slots).T, float("-inf"))
        fused = fused_ranks(scores, ids)
        best = top_k_masked(fused, torch.ones(n, dtype=torch.bool, device=slots.device), ids, k)
        best = best[torch.argsort(ids[best], descending=True)]  # newer first, then stably by the fused score:
        return slots.index_select(0, best[torch.sort(fused[best], descending=True, stable=True).indices])

    def contrasted_key_means(self, slots: torch.Tensor, w: int) -> torch.Tensor:
        """(L, n, H, D) float32: the mean keys of ``slots`` ((n,) held slots), each less the mean of its up to ``w``
        neighbours on each side among the held blocks of its camera and stream in creation order
        (``scoring/contrast.py``, ``memory.rekv.contrast``); ``w`` 0: the mean keys as held. O(held blocks)."""
        if w == 0 or slots.numel() == 0:
            return self.key_mean.index_select(1, slots)
        held = self.ordered()  # (M,) creation order
        group = self.camera.index_select(0, held) * (len(self._codes) + 1) + self.stream.index_select(0, held)
        group, perm = torch.sort(group, stable=True)  # grouped by (camera, stream), creation order inside a group
        seq = held.index_select(0, perm)  # (M,)
        contrasted = temporal_contrast(self.key_mean.index_select(1, seq), group, w)  # (L, M, H, D)
        where = torch.full((self.capacity,), -1, dtype=torch.long, device=self.device)
        where[seq] = torch.arange(seq.numel(), device=self.device)
        rows = where.index_select(0, slots)
        if bool((rows < 0).any()):
            raise ValueError("contrasted_key_means: a slot that holds no block")
        return contrasted.index_select(1, rows)


class Candidates:
    """A question's candidate blocks as a mask over the index; blocks are built only on demand.

    ``blocks()`` is what ``VideoMemoryEngine.candidates`` always returned (creation order);
    policies that score every candidate read the index under ``mask`` instead of it.
    """

    def __init__(self, index: BlockIndex, mask: torch.Tensor) -> None:
        self.index = index
        self.mask = mask  # (C,) bool
        self.count = int(mask.sum())

    @classmethod
    def of(cls, index: BlockIndex, blocks: Sequence[FrameBlock]) -> "Candidates":
        """The candidates ``blocks`` (each held in the store the index belongs to)."""
        mask = torch.zeros(index.capacity, dtype=torch.bool, device=index.device)
        if blocks:
            mask[torch.tensor([index.slot_of[b.block_id] for b in blocks], device=index.device)] = True
        return cls(index, mask)

    def __len__(self) -> int:
        return self.count

    def blocks(self) -> list[FrameBlock]:
        """Every candidate in creation order: O(count), for policies whose candidates are few (the resident tier)."""
        return self.index.blocks_of(self.index.by_age(self.mask))

    def recent_within(self, max_tokens: int) -> list[FrameBlock]:
        """``policy.recent_within(self.blocks(), max_tokens)``, reading only the newest candidates."""
        newest = self.index.newest(self.mask, max_tokens + 1)  # every block has >= 1 token: enough to find the cut
        return newest_within(self.index.blocks_of(newest), max_tokens)

    def without(self, blocks: Sequence[FrameBlock]) -> "Candidates":
        mask = self.mask.clone()
        if blocks:
            mask[torch.tensor([self.index.slot_of[b.block_id] for b in blocks], device=mask.device)] = False
        return Candidates(self.index, mask)
