"""``mukv``: MuKV (seed 001), multi-grained KV memory with dual-signal compression.

What the paper (and the reader's notes on its public code) prescribes:
- Three memories from the same visual features, no second vision pass: patch
  blocks (a frame's tokens split in ``patch_split`` runs: 196 / 4 = 49 on
  LLaVA-OV), frame blocks (196) and segment blocks (``segment_frames`` = 4
  frames, 784). The notes' memory figures (177K tokens uncompressed per 300
  frames = 3 x 300 x 196) show every frame is in all three views.
- Each granularity is its own encoding stream: a block attends to the sink and
  the recent blocks *of its granularity* (the paper's "independent
  same-granularity prefill"; the public code encodes each block after the
  prompt only, which we do not follow).
- Dual-signal compression right after encoding: last-layer attention
  importance (mean over heads of the attention each block token receives from
  the block's own tokens) plus FFT energy of the block's keys, min-max
  normalised and mixed with alpha_g; keep floor(rho_g x |g|) tokens, in order,
  in every layer.
- Retrieval: cosine of the question vector with each block's representative
  (mean of its kept last-layer keys, heads concatenated), top 2 k_g per
  granularity, then the semi-hierarchical rerank against the centroid of the
  top segment candidates with lambda_g, keep k_g (``memory/scoring/mukv.py``).
- Retrieved blocks are placed in *time order* (stamp, then segment before
  frame before patch, then patch index) at consecutive positions: the public
  code concatenates them by granularity and loses temporal order; ours keeps it.

Choices, ours: keys for the FFT signal and the representative are pre-RoPE
(position must not decide importance or retrieval); the question vector is the
mean pre-RoPE query of the question's last layer read after the sink
(``PolicyHost.probe``; the public code uses the last token's key).
"""

from __future__ import annotations

import torch

from videokv_node.memory.store.block import FrameBlock
from videokv_node.memory.store.block_index import BlockIndex, Candidates
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.memory.config import GRANULARITIES
from videokv_node.memory.policies.base import EncodeJob, MemoryPolicy, PolicyHost, Unit, recent_resident
from videokv_node.memory.context.selection import Static
from videokv_node.memory.scoring.mukv import (
    attention_importance,
    dual_signal,
    frequency_importance,
    keep_indices,
    semi_hierarchical_rerank,
)
from videokv_node.memory.scoring.queries import query_means
from videokv_node.memory.scoring.select_kv import cosine_scores
from videokv_node.models.attention import attention_probs

RANK = {"segment": 0, "frame": 1, "patch": 2}  # order among blocks starting at the same stamp


class MuKVPolicy(MemoryPolicy):
    name = "mukv"
    uses_offload = True

    def __init__(self, config, adapter) -> None:
        super().__init__(config, adapter)
        self.cfg = config.mukv
        T = adapter.tokens_per_frame
        if "patch" in self.cfg.granularities and T % self.cfg.patch_split:
            raise ValueError(f"memory.mukv.patch_split ({self.cfg.patch_split}) must divide the {T} tokens of a frame")
        self._segment: list[Unit] = []
        self._importance: dict[int, torch.Tensor] = {}  # unit index in the job -> (t,) last-layer attention importance
        self.last_selection: dict[str, list[int]] = {}  # granularity -> block ids (tests, debugging)

    def reset(self) -> None:
        self._segment.clear()

    # --- state ----------------------------------------------------------------
    def state_dict(self) -> dict:
        """The partial segment: the frames waiting for a segment block (their features, offsets,
        cameras and stamps). Patch and frame blocks of those frames are already in the store."""
        meta = {"segment": [{"camera": u.camera, "stamp_ns": u.stamp_ns} for u in self._segment]}
        tensors = {}
        if self._segment:
            tensors["segment/feat"] = torch.stack([u.feat for u in self._segment])  # (n, T, hidden)
            tensors["segment/offsets"] = torch.stack([u.offsets for u in self._segment])  # (n, P, T)
        return {"meta": meta, "tensors": tensors}

    def load_state_dict(self, state, blocks) -> None:
        meta, tensors = state["meta"], state["tensors"]
        frames = meta["segment"]
        n = len(frames)
        if n and ("segment" not in self.cfg.granularities or n >= self.cfg.segment_frames):
            raise ValueError(
                f"the partial segment holds {n} frames, which memory.mukv (granularities {list(self.cfg.granularities)}, "
                f"segment_frames {self.cfg.segment_frames}) would never complete"
            )
        feats, offsets = tensors.get("segment/feat"), tensors.get("segment/offsets")
        if n and (feats is None or offsets is None or feats.shape[0] != n or offsets.shape[0] != n):
            raise ValueError(f"the partial segment's {n} frames lack their features or offsets")
        self._segment = [
            Unit(feats[i].clone(), offsets[i].cpu().clone(), str(f["camera"]), int(f["stamp_ns"])) for i, f in enumerate(frames)
        ]

    # --- encoding -----------------------------------------------------------
    def on_frame(self, store: BlockStore, unit: Unit) -> list[EncodeJob]:
        jobs = []
        grans = self.cfg.granularities
        if "segment" in grans:
            self._segment.append(unit)
            if len(self._segment) == self.cfg.segment_frames:
                jobs.append(EncodeJob([self._segment_unit(self._segment)], stream="segment"))
                self._segment = []
        if "frame" in grans:
            jobs.append(EncodeJob([Unit(unit.feat, unit.offsets, unit.camera, unit.stamp_ns, rank=RANK["frame"])], stream="frame"))
        if "patch" in grans:
            n = self.cfg.patch_split
            size = unit.feat.shape[0] // n
            patches = []
            for i in range(n):
                sl = slice(i * size, (i + 1) * size)
                off = unit.offsets[:, sl]
                patches.append(
                    Unit(unit.feat[sl], off - off.min(), unit.camera, unit.stamp_ns, kind="patch", rank=RANK["patch"] + i)
                )
            jobs.append(EncodeJob(patches, stream="patch"))
        return jobs

    def _segment_unit(self, frames: list[Unit]) -> Unit:
        offsets, start = [], 0
        for f in frames:
            offsets.append(f.offsets + start)
            start += f.span
        return Unit(
            feat=torch.cat([f.feat for f in frames]),
            offsets=torch.cat(offsets, dim=1),
            camera=frames[0].camera,
            stamp_ns=frames[0].stamp_ns,
            stamps_ns=tuple(f.stamp_ns for f in frames),
            kind="segment",
            rank=RANK["segment"],
        )

    def encoding_context(self, store: BlockStore, job: EncodeJob) -> list[FrameBlock]:
        # Departure P5 (docs/POLICIES.md): each granularity's window holds its blocks as compressed
        # (rho_g of each block's tokens), not the raw tokens of the window.
        return recent_resident(store, self.config.local_window_tokens, stream=job.stream)

    def encode_observer(self, job: EncodeJob):
        last = self.n_layers - 1
        sizes = [u.feat.shape[0] for u in job.units]
        n = sum(sizes)
        self._importance.clear()

        def observe(layer: int, query: torch.Tensor, key: torch.Tensor, scale: float) -> None:
            if layer != last:
                return
            probs = attention_probs(query, key, scale)  # (H, n, K); the job's tokens are the last n keys
            k_len = probs.shape[-1]
            at = 0
            for i, t in enumerate(sizes):
                cols = slice(k_len - n + at, k_len - n + at + t)
                self._importance[i] = attention_importance(probs[:, at : at + t, cols])  # the block's own tokens
                at += t

        return observe

    def after_encode(self, store: BlockStore, job: EncodeJob, blocks: list[FrameBlock]) -> None:
        last = self.n_layers - 1
        for i, block in enumerate(blocks):
            gran = job.stream
            keys = store.layer_kv(block, last)[0]  # (H, t, D) at the encoding positions
            pre = self.adapter.rotate_keys(keys, -block.positions).float()  # (H, t, D) pre-RoPE
            flat = pre.transpose(0, 1).reshape(pre.shape[1], -1)  # (t, H * D)
            scores = dual_signal(self._importance[i], frequency_importance(flat), getattr(self.cfg, f"alpha_{gran}"))
            keep = keep_indices(scores, getattr(self.cfg, f"keep_{gran}"))
            for layer in range(self.n_layers):
                store.keep(block, layer, keep)
            rep = flat[keep.to(flat.device)].mean(0).cpu()  # (H * D,)
            if block in store:
                store.set_rep(block, rep)  # the block and its index slot
            else:
                block.rep = rep

    # --- questions ----------------------------------------------------------
    def select(self, host: PolicyHost, candidates: Candidates, question: str) -> Static:
        """The three pools read from the index: per granularity, the candidates of that stream in
        creation order and their representatives, one gathered row each."""
        q = query_means(host.probe(question)[-1], self.adapter.geometry.n_kv_heads).reshape(-1)  # (H_kv * D,): the last layer's
        index = host.store.index
        order = index.by_age(candidates.mask)  # (N,) slots in creation order
        stream = index.stream.index_select(0, order)  # (N,) stream codes
        by_gran = {g: torch.masked_select(order, stream == index.code(g)) for g in GRANULARITIES}  # (N_g,) slots
        present = [g for g in GRANULARITIES if by_gran[g].numel()]
        # Every candidate's row is gathered for the cosine (O(N), no sort) rather than scored in place on
        # the slot tensor: the BLAS product rounds a row differently at a matrix's tail, and the scores,
        # hence the selection, must stay those of the gathered rows.
        reps = {g: _reps(index).index_select(0, by_gran[g]) for g in present}  # (N_g, H_kv * D)
        scores = {g: cosine_scores(reps[g], q) for g in present}
        k = {g: getattr(self.cfg, f"retrieve_{g}") for g in present}
        lam = {g: getattr(self.cfg, f"rerank_{g}") for g in present}
        picked = semi_hierarchical_rerank(scores, reps, k, lam, top_segments=self.cfg.top_segments, over=self.cfg.over_retrieval)
        slots = {g: by_gran[g].index_select(0, picked[g].to(by_gran[g].device)) for g in present}
        chosen = sorted((b for g in present for b in index.blocks_of(slots[g])), key=lambda b: b.order)
        self.last_selection = {g: [b.block_id for b in index.blocks_of(slots[g])] for g in present}
        return Static.everywhere(chosen, self.n_layers)


def _reps(index: BlockIndex) -> torch.Tensor:
    """The index's representatives, read only where a candidate stands (every MuKV block gets one when encoded)."""
    if index.rep is None:
        raise RuntimeError("mukv: candidates held but the index has no representatives")
    return index.rep
