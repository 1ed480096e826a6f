"""``streamkv``: StreamKV (seed 000), segment-based KV retrieval and compression.

What the paper prescribes, and where it lives here:
- Semantic segments: cosine similarity of adjacent frame embeddings below
  ``similarity_threshold`` starts a segment, segments are at least
  ``min_segment_frames`` long, and past ``max_segment_frames`` the most similar
  adjacent pair is merged (``memory/scoring/segmenter.py``).
- Segment-based sliding-window encoding: a segment is encoded once it is
  closed, all its frames and then its summary frame (the mean of its frames at
  each spatial location) in one pass, attending to the local window of past
  KV (Eq. 2, X = [S || f_s]).
- Compression right after each segment is encoded: per layer, SelectKV keeps
  the frame blocks closest to the guidance prompt, N = ceil((1 - theta) T_i) x L
  blocks over all layers (Eq. 9); the summary block is never compressed (Eq. 10).
- Retrieval: SelectKV over every block of the bank (compressed frames and
  summaries) against the question vector, N = N_r x L (Eq. 11); retrieved tokens
  are placed consecutively (the engine's default layout).
- The layer split (``split``): robot, Eqs. 5-8 as printed (exactly N); paper,
  StreamKV's code (scores standardised per layer, counts rescaled into
  (1 -/+ 0.75) x the mean compressing, (1 -/+ 0.25) x N_r retrieving, so N is
  kept only approximately; ``select_kv.code_layer_budgets``, docs/POLICIES.md).

Choices where the paper is not specific, ours:
- Frame embeddings f_t for segmentation are the projected visual tokens the
  decoder receives (the paper takes the ViT output; the projector is per token,
  so boundaries differ only through it).
- Representative keys r are the mean pre-RoPE keys over the block's tokens
  with heads concatenated (Eq. 3, "we do not distinguish between attention
  heads"); criteria c are the mean pre-RoPE queries of the guidance prompt or
  question, read right after the prompt sink (``PolicyHost.probe``), query heads
  averaged per KV group (GQA) and concatenated. Pre-RoPE: a block's score must
  not depend on where it happened to be encoded.
- A question asked while a segment is open sees that segment's frames,
  uncompressed. Their KV is cached (issue 16): each frame joining the open
  segment is encoded on arrival after the local window and the members before
  it, exactly as the segment's one pass would encode it, so a question reads
  it as it is; a merge re-encodes from the merged member on. The cache counts
  in the resident budget (older blocks are demoted to make room) and in the
  stats. When the segment closes its cached frames become its blocks and only
  the summary frame is encoded, after them: the paper's one pass over
  [S || f_s], split where the frames arrived.
- A closing rule of ours besides the paper's (robot only; 0, off, under the
  paper preset, issue 44): an open segment spanning more than ``max_segment_s``
  (header stamps) closes at the next frame. Otherwise a static scene keeps a
  segment open for ever (merging caps it at M members, not in time); at 30 s
  and 0.5 fps a segment closes after 16 frames, so M = 64 is never reached. The cache is counted in the budget by demoting older blocks, but
  never the encoding window's (that would change what the next frames are
  encoded with, so the KV would depend on the caps): a cache larger than the
  room the budget leaves past the window (``budget_tokens`` less the sink and
  the window) stays over budget by the difference, at most M frames' worth.
- Blocks leave the device oldest first to the host arena (the KV bank), as in
  ReKV; past the arena's cap the oldest is dropped.
"""

from __future__ import annotations

import math

import torch

from videokv_node.memory.store.block import FrameBlock, LayerKV
from videokv_node.memory.store.block_index import Candidates
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.memory.policies.base import EncodeJob, MemoryPolicy, PolicyHost, Unit, recent_resident
from videokv_node.memory.context.selection import Static
from videokv_node.memory.scoring.segmenter import SegmenterConfig, SemanticSegmenter
from videokv_node.memory.scoring.select_kv import CODE_COMPRESS_TEMP, CODE_RETRIEVE_TEMP, code_bounds, cosine_scores, criterion, select_kv
from videokv_node.memory.records.state import dtype_from_name, dtype_name


class StreamKVPolicy(MemoryPolicy):
    name = "streamkv"
    uses_offload = True

    def __init__(self, config, adapter) -> None:
        super().__init__(config, adapter)
        self.cfg = config.streamkv
        self.segmenter = SemanticSegmenter(
            SegmenterConfig(
                threshold=self.cfg.similarity_threshold,
                min_frames=self.cfg.min_segment_frames,
                max_frames=self.cfg.max_segment_frames,
                similarity=self.cfg.similarity,
            )
        )
        # Open-segment frames: only (camera, stamp) per frame. Their features live once in the
        # segmenter's members (at most max_segment_frames of them, merged frames averaged), so
        # what waits outside the KV budget is bounded by M frames of features, however long
        # a segment stays open.
        self._meta: dict[int, tuple[str, int]] = {}
        self._offsets: torch.Tensor | None = None  # (P, T): every frame's token offsets
        self._dtype = torch.float32
        self._next_item = 0
        self._open: list[tuple[object, FrameBlock]] = []  # (segment member, its cached block), in member order
        self.guidance: torch.Tensor | None = None  # (L, H_kv * D)
        self.last_budgets: list[int] = []  # per layer, of the last retrieval (tests, debugging)

    def setup(self, host: PolicyHost) -> None:
        self.host = host  # encodes the open segment's cache (``_refresh_open``)
        # Departure P6 (docs/POLICIES.md): the guidance prompt is read once, right after the sink, and its
        # text paraphrases the paper's five elements; StreamKV's code reads its own six-point prompt in the
        # same pass as each segment (after the window and the segment's frames).
        self.guidance = criterion(host.probe(self.cfg.guidance_prompt), self.adapter.geometry.n_kv_heads)  # (L, H_kv * D)

    def reset(self) -> None:
        self.segmenter.reset()
        self._meta.clear()
        self._open = []

    # --- state ----------------------------------------------------------------
    def state_dict(self) -> dict:
        """The open segment (the segmenter's state and each waiting frame's camera and stamp),
        the frames' token offsets and feature dtype, and the next item id."""
        seg_meta, seg_tensors = self.segmenter.state()
        meta = {
            "segmenter": seg_meta,
            "frames": [[item, camera, stamp] for item, (camera, stamp) in self._meta.items()],
            "feature_dtype": dtype_name(self._dtype),
            "next_item": self._next_item,
        }
        tensors = {f"segmenter/{name}": t for name, t in seg_tensors.items()}
        if self._offsets is not None:
            tensors["offsets"] = self._offsets  # (P, T)
        # The open segment's cached KV, saved rather than re-encoded on load: a cache rebuilt in other
        # passes would differ in the last bits from the one built while streaming.
        cached = [block for _, block in self._open]
        meta["open_cached"] = len(cached)
        if cached:
            open_kv = [_open_kv(b) for b in cached]
            tensors["open/keys"] = torch.stack([k for k, _ in open_kv])  # (n, L, H, T, D)
            tensors["open/values"] = torch.stack([v for _, v in open_kv])
            tensors["open/positions"] = torch.stack([b.positions for b in cached])  # (n, P, T)
            tensors["open/key_mean"] = torch.stack([b.key_mean for b in cached])  # (n, L, H, D)
        return {"meta": meta, "tensors": tensors}

    def load_state_dict(self, state, blocks) -> None:
        meta, tensors = state["meta"], state["tensors"]
        frames = {int(item): (str(camera), int(stamp)) for item, camera, stamp in meta["frames"]}
        dtype = dtype_from_name(meta["feature_dtype"])
        next_item = int(meta["next_item"])
        offsets = tensors.get("offsets")
        pending = [int(i) for m in meta["segmenter"]["members"] for i in m["item_ids"]]
        if set(pending) != set(frames) or any(i >= next_item for i in pending):
            raise ValueError(f"open segment frames {pending} do not match their stamps {sorted(frames)} (next item {next_item})")
        n_members = len(meta["segmenter"]["members"])
        if n_members > self.cfg.max_segment_frames:
            raise ValueError(
                f"the open segment has {n_members} members, more than memory.streamkv.max_segment_frames "
                f"({self.cfg.max_segment_frames})"
            )
        if pending and offsets is None:
            raise ValueError("an open segment without its frames' token offsets")
        seg_tensors = {name.removeprefix("segmenter/"): t for name, t in tensors.items() if name.startswith("segmenter/")}
        self.segmenter.load_state(meta["segmenter"], seg_tensors)  # validates, then assigns; nothing below can fail
        self._meta = frames
        self._offsets = None if offsets is None else offsets.cpu()  # positions live on the host
        self._dtype, self._next_item = dtype, next_item
        self._open = []
        n_cached = int(meta.get("open_cached", 0))
        if 0 < n_cached <= len(self.segmenter.pending) and "open/keys" in tensors:
            self._open = list(zip(self.segmenter.pending, self._cached_blocks(n_cached, tensors)))

    def _cached_blocks(self, n: int, tensors: dict[str, torch.Tensor]) -> list[FrameBlock]:
        """The saved cache of the first ``n`` open members as blocks (provisional ids -1, -2, ...)."""
        device = self.adapter.device
        keys, values = tensors["open/keys"].to(device), tensors["open/values"].to(device)  # (n, L, H, T, D)
        blocks = []
        for i, member in enumerate(self.segmenter.pending[:n]):
            unit = self._member_unit(member)
            positions = tensors["open/positions"][i].cpu()  # (P, T)
            index = torch.arange(positions.shape[1])
            layers: list[LayerKV | None] = [LayerKV(index=index, logical=positions, keys=keys[i, l].clone(),
                                                    values=values[i, l].clone()) for l in range(self.n_layers)]
            blocks.append(FrameBlock(block_id=-(i + 1), camera=unit.camera, stamp_ns=unit.stamp_ns, positions=positions,
                                     key_mean=tensors["open/key_mean"][i].cpu(), layers=layers, stamps_ns=unit.stamps_ns))
        return blocks

    def after_restore(self, store: BlockStore) -> None:
        self._refresh_open()  # members a snapshot did not cache (one written before caching existed)

    # --- encoding -----------------------------------------------------------
    def on_frame(self, store: BlockStore, unit: Unit) -> list[EncodeJob]:
        item = self._next_item
        self._next_item += 1
        self._meta[item] = (unit.camera, unit.stamp_ns)
        self._offsets, self._dtype = unit.offsets, unit.feat.dtype
        closed = []
        if self._must_close(unit):
            closed.append(self.segmenter.flush())
        closed += self.segmenter.push(item, unit.feat)
        return [self._segment_job(segment) for segment in closed]

    def _must_close(self, unit: Unit) -> bool:
        """Our closing rule (module docstring): the open segment spans more than ``max_segment_s``."""
        pending = self.segmenter.pending
        if not pending:
            return False
        first = self._meta[pending[0].item_ids[0]][1]
        return self.cfg.max_segment_s > 0 and unit.stamp_ns - first > self.cfg.max_segment_s * 1e9

    def after_frame(self, host: PolicyHost) -> None:
        self._refresh_open()

    def _refresh_open(self) -> None:
        """Bring the open segment's cached KV up to date: keep the cached members still pending (same
        member, same place), encode the rest in one pass after them (a new frame: one member; a
        merge: from the merged member on)."""
        pending = self.segmenter.pending
        n = 0
        while n < min(len(pending), len(self._open)) and self._open[n][0] is pending[n]:
            n += 1
        blocks = [block for _, block in self._open[:n]]
        if n < len(pending):
            blocks = self.host.encode_units(EncodeJob([self._member_unit(m) for m in pending[n:]], ready=blocks), provisional=True)
        self._open = list(zip(pending, blocks))

    def open_segment(self) -> _OpenSegment:
        return _OpenSegment(self)

    def _member_unit(self, member) -> Unit:
        """A segment member as a unit: one frame, or the mean of merged adjacent frames (cited by all of them)."""
        camera = self._meta[member.item_ids[0]][0]
        stamps = tuple(self._meta[i][1] for i in member.item_ids)
        # The member's feature is an exact float32 copy for a single frame; back to the model's dtype.
        feat = member.feature.to(self._dtype)
        return Unit(feat=feat, offsets=self._offsets, camera=camera, stamp_ns=stamps[0], stamps_ns=stamps)

    def _segment_job(self, segment) -> EncodeJob:
        """The closing segment: its cached frames (when the cache holds exactly its members) and its summary."""
        cached = [block for _, block in self._open]
        same = len(self._open) == len(segment.members) and all(a is b for (a, _), b in zip(self._open, segment.members))
        ready = cached if same else []
        self._open = []
        units = [] if ready else [self._member_unit(member) for member in segment.members]
        if self.cfg.summary_frames:
            last = self._member_unit(segment.members[-1])
            all_stamps = tuple(self._meta[i][1] for m in segment.members for i in m.item_ids)
            units.append(
                Unit(
                    feat=segment.summary_feature().to(last.feat.dtype),
                    offsets=last.offsets,
                    camera=last.camera,
                    stamp_ns=all_stamps[-1],
                    stamps_ns=all_stamps,
                    kind="summary",
                    rank=1,  # after the segment's last frame in time order
                    protected=True,
                )
            )
        for member in segment.members:
            for i in member.item_ids:
                self._meta.pop(i, None)
        return EncodeJob(units, ready=ready)

    def encoding_context(self, store: BlockStore, job: EncodeJob) -> list[FrameBlock]:
        # Departure P5 (docs/POLICIES.md, kept under `paper`): the window is the newest blocks as the
        # store holds them, so a layer's window lacks the blocks SelectKV dropped there; StreamKV's code
        # keeps its last n_local tokens raw and drops blocks from the retrieval bank only.
        return recent_resident(store, self.config.local_window_tokens)

    def after_encode(self, store: BlockStore, job: EncodeJob, blocks: list[FrameBlock]) -> None:
        frames = [b for b in blocks if not b.protected]
        if not frames or self.cfg.compression_ratio == 0.0:
            return
        if self.guidance is None:
            raise RuntimeError("streamkv: a frame encoded before setup() read the guidance prompt")
        L = self.n_layers
        total = math.ceil((1.0 - self.cfg.compression_ratio) * len(frames)) * L
        reps = torch.stack([b.key_mean.reshape(L, -1) for b in frames])  # (T_i, L, H*D)
        scores = [cosine_scores(reps[:, layer], self.guidance[layer]) for layer in range(L)]
        # split code: each layer's count within (1 -/+ 0.75) x the mean, as StreamKV's code; else Eqs. 5-8 exactly
        mean = len(frames) * (1.0 - self.cfg.compression_ratio)  # the code's seq_len x ratio (kept share)
        bounds = code_bounds(mean, CODE_COMPRESS_TEMP, len(frames), True) if self.cfg.split == "code" else None
        keep = select_kv(scores, total, bounds)
        for layer in range(L):
            kept = set(keep[layer].tolist())
            for i, block in enumerate(frames):
                if i not in kept:
                    store.keep(block, layer, None)

    # --- questions ----------------------------------------------------------
    def select(self, host: PolicyHost, candidates: Candidates, question: str) -> Static:
        """SelectKV over every candidate, read from the index: per layer, the candidates that keep
        tokens there in creation order, their mean keys (heads concatenated) one gathered row each.

        The rows are gathered (one ``index_select``, O(N)) rather than scored in place on the slot
        tensor: the BLAS matrix-vector product rounds a row's dot product differently at the tail of
        a matrix, so scores taken in place would differ from these in the last bits and could flip
        a near-tie; the selection stays the one the gathered scores give."""
        L = self.n_layers
        # Departure P6: the question read right after the sink (no memory); the code reads it in a
        # retrieval pass over its local window before choosing the blocks.
        query = criterion(host.probe(question), self.adapter.geometry.n_kv_heads)  # (L, H*D)
        index = host.store.index
        order = index.by_age(candidates.mask)  # (N,) slots in creation order
        # per layer (n_l,) slots that keep tokens there, in creation order
        ranges = [torch.masked_select(order, index.present[:, layer].index_select(0, order)) for layer in range(L)]
        scores = [
            cosine_scores(index.key_mean[layer].index_select(0, r).reshape(r.numel(), -1), query[layer]) if r.numel() else torch.zeros(0)
            for layer, r in enumerate(ranges)
        ]
        bounds = code_bounds(self.cfg.retrieve_frames, CODE_RETRIEVE_TEMP, 128, False) if self.cfg.split == "code" else None
        chosen = select_kv(scores, self.cfg.retrieve_frames * L, bounds)
        self.last_budgets = [int(c.numel()) for c in chosen]
        return Static.layers([index.blocks_of(r[c.to(r.device)]) for r, c in zip(ranges, chosen)])


class _OpenSegment:
    """StreamKV's open segment as the engine reads it (``OpenSegment``): a view of the policy's state."""

    def __init__(self, policy: StreamKVPolicy) -> None:
        self.policy = policy

    def units(self) -> list[Unit]:
        return [self.policy._member_unit(member) for member in self.policy.segmenter.pending]

    def blocks(self, host: PolicyHost) -> list[FrameBlock]:
        """The open segment's cached blocks (refreshed first if stale: right after a snapshot load)."""
        self.policy._refresh_open()
        return [block for _, block in self.policy._open]

    def entries(self) -> int:
        return sum(block.entries for _, block in self.policy._open)

    def feature_bytes(self) -> int:
        return sum(m.feature.numel() * m.feature.element_size() for m in self.policy.segmenter.pending)


def _open_kv(block: FrameBlock) -> tuple[torch.Tensor, torch.Tensor]:
    """An open member's cached (L, H, T, D) K and V: it keeps every token of every layer, resident (provisional)."""
    kvs = [block.kept(layer).resident_kv() for layer in range(len(block.layers))]
    return torch.stack([k for k, _ in kvs]), torch.stack([v for _, v in kvs])
