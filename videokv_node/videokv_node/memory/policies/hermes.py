"""``hermes``: HERMES (seed 002), the KV cache as a hierarchical memory, no retrieval at question time.

What the paper prescribes: one resident cache with a per-layer budget, nothing
offloaded (TTFT does not grow with the stream); layers split by depth (10% shallow
keep by a forgetting curve, 30% deep by a generic pseudo-query's attention, 60% middle
interpolate with a weight omega moving from recency to attention with depth);
cross-layer smoothing of scores before top-k (s_l <- (1 - lambda) s_l + lambda s_{l+1});
deep layers' pruned tokens folded into one summary token per layer (V averaged, K
re-rotated to its position then averaged, running and count-weighted); positions
re-indexed lazily (streaming) or eagerly (offline), keys re-rotated exactly.

The notes we have lost HERMES' formulas; where its public script
(llavaov_online_official.py) shows a value we take it (forgetting rate k = 20,
smoothing 0.1 / 0.3 / 0.4 by role, the layer split's rounding); choices, ours (see
config.HermesConfig and memory/scoring/hermes.py):
omega linear from 1 at the first middle layer to 0 at the last, scores normalised to sum 1
per layer before mixing, a token missing from the next layer contributing 0 there, and the
summary token standing right after the sink, one per layer, never scored (departure P8).

Pseudo-queries, two modes (``memory.hermes.pseudo_queries``):
- ``probe`` (robot, ours): one generic question's pre-RoPE queries read once after
  the sink, no frames (``PolicyHost.probe``), scored against the live keys at each
  compression: cheap, but its queries past the first layer never saw the video.
- ``live`` (paper preset, HERMES' script): before each compression the global
  query and the mixed "local; global" one are run through the model over the
  live cache, and deep / middle layers are scored with the attention they pay to the
  cached tokens (``PolicyHost.pseudo_attention``: the engine's model runner, memory/context/model_runner.py). The script's queries after a first
  question add it and its answer; ours stay generic (the memory keeps no conversation).

Schedule (``recency_rate_deep``, ``omega_gamma``, ``schedule_end``): robot keeps
the forgetting rate at 20 in every middle layer and moves omega 1 -> 0 up to the
last middle layer; the paper preset follows the script, rate 20 -> 0.5 and
omega 1 -> 0.1 with depth reaching 1 at the first deep layer.

Recency (``recency``): the script scores token j of a layer's N cached video tokens
exp(-k (N-1-j) / (N-1)), its place in the compacted cache (paper preset: ``token``).
Robot (ours, ``frame``): a frame's age over the oldest kept frame's, so every token of a
frame scores alike in shallow layers and which tokens of the oldest kept frame survive
follows the (stable) sort: the first ones in the frame's token order.

Chunks (``budget_rule``): the script encodes 16 frames at a time and, once a layer holds
more than ``kv_size`` video tokens at a chunk's end, keeps ``kv_size`` (4,096; the prompt
not counted) in each layer, so a layer peaks at prompt + kv_size + one chunk (7,232 video
tokens for LLaVA-OV). Paper preset (``script``): the same, frames counted in chunks of
``chunk_frames`` (the engine's resident cap is raised by one chunk for it). Robot
(``hard_cap``, ours): ``budget_tokens`` is a hard cap, sink included, so a compression
leaves room for the next chunk: every layer is compressed to ``budget_tokens`` - sink -
(``chunk_frames`` - 1) frames, the next compression ``chunk_frames`` frames later
(16,384 - sink - 2,940 ~ 13.4K tokens per layer at the robot defaults; at the paper's
4,096 it would be 4,096 - sink - 2,940 ~ 1.1K, 3.9x less than the script's 4,096).
"""

from __future__ import annotations

import torch

from videokv_node.memory.store.block import FrameBlock, LayerKV, Tier
from videokv_node.memory.store.block_index import Candidates
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.memory.config import ConfigError
from videokv_node.memory.policies.base import EncodeJob, MemoryPolicy, PolicyHost, present_in
from videokv_node.memory.context.selection import Static
from videokv_node.memory.scoring.top_k import top_k_stable
from videokv_node.memory.context.retrieval_cache import logical_layout, pack_layout
from videokv_node.memory.scoring.hermes import (
    cross_layer_smooth,
    layer_roles,
    layer_scores,
    omega,
    mixed_query,
    pseudo_query_attention,
    recency_scores,
    schedule_rate,
    summary_token,
)

TOKEN_ID_STRIDE = 1 << 20  # global token id = block_id * stride + token index (blocks are far smaller)


class HermesPolicy(MemoryPolicy):
    name = "hermes"
    uses_offload = False
    resident_context = True

    def __init__(self, config, adapter) -> None:
        super().__init__(config, adapter)
        self.cfg = config.hermes
        self.script = self.cfg.budget_rule == "script"
        self.roles = layer_roles(self.n_layers, self.cfg.shallow_ratio, self.cfg.deep_ratio)
        middle = [l for l, r in enumerate(self.roles) if r == "middle"]
        # Depth 0 -> 1 of omega and the rate schedule: up to the last middle layer (ours) or the first deep one (script).
        end = middle[-1] + (1 if self.cfg.schedule_end == "first_deep" else 0) if middle else 0
        self._middle = (middle[0], end) if middle else (0, 0)
        self._frames = 0
        self._frame_of: dict[int, int] = {}  # block id -> frame index, for ages
        self._next_pos: int | None = None  # lazy: where the stream continues
        self.summary: FrameBlock | None = None
        self._restored_summary: int | None = None  # the summary's id between load_state_dict and after_restore
        self._summary_count = [0] * self.n_layers
        self.reindexed = 0  # lazy re-indexings done (tests, stats)
        self.compressions = 0  # compressions done (tests, stats)

    def setup(self, host: PolicyHost) -> None:
        self.host = host  # the sink to place the cache after, the store, ids for the summary token
        self.sink_len = host.sink.n_tokens
        self.check_budget(self.config.budget_tokens, self.sink_len)
        self.budget = self._layer_budget(self.config.budget_tokens)  # tokens per layer
        # hard_cap: room for the rest of the next chunk; script: the chunk goes above the budget.
        self.headroom = 0 if self.script else (self.cfg.chunk_frames - 1) * self.adapter.tokens_per_frame
        if self.cfg.pseudo_queries == "probe":
            self.pseudo = host.probe(self.cfg.pseudo_query).float()  # (L, n, H_q, D) pre-RoPE

    def check_budget(self, budget_tokens: int, sink_tokens: int) -> None:
        """Each layer must keep one frame (and the summary token) plus room for the rest of a chunk."""
        per_layer = budget_tokens - (0 if self.script else sink_tokens)
        headroom = 0 if self.script else (self.cfg.chunk_frames - 1) * self.adapter.tokens_per_frame
        if per_layer - 1 - headroom < self.adapter.tokens_per_frame:
            need = "one frame" if self.script else f"one frame plus a chunk of memory.hermes.chunk_frames ({self.cfg.chunk_frames}) frames"
            raise ConfigError(f"memory.budget_tokens ({budget_tokens}) leaves {per_layer} tokens per layer (budget_rule {self.cfg.budget_rule}): "
                              f"hermes needs room for {need} of {self.adapter.tokens_per_frame} tokens; raise the budget or lower chunk_frames")

    def _layer_budget(self, budget_tokens: int) -> int:
        """Tokens a layer keeps after a compression: the script's kv_size, or ours less the sink."""
        return budget_tokens if self.script else budget_tokens - self.sink_len

    def resident_tokens(self, budget_tokens: int, sink_tokens: int) -> int:
        """script: a layer holds its budget plus up to one chunk between compressions."""
        if self.script:
            return budget_tokens + self.cfg.chunk_frames * self.adapter.tokens_per_frame
        return super().resident_tokens(budget_tokens, sink_tokens)

    def reconfigure(self, config, store: BlockStore) -> None:
        """A new per-layer budget; a smaller one compresses every layer to it now, as after a chunk."""
        super().reconfigure(config, store)
        self.budget = self._layer_budget(config.budget_tokens)
        self._enforce_layer_budget(store)

    def reset(self) -> None:
        self._frame_of.clear()
        self._next_pos = None
        self.summary = self._restored_summary = None
        self._summary_count = [0] * self.n_layers

    # --- state ----------------------------------------------------------------
    def state_dict(self) -> dict:
        """Frame count and ages (of the blocks held: an evicted block's age is never read again),
        where the stream continues, the summary token (its block id and per-layer fold counts)
        and the counters. The summary's K/V are a block's, saved with the blocks."""
        store = self.host.store
        held = {b.block_id for b in store.blocks()}
        meta = {
            "frames": self._frames,
            "frame_of": [[block_id, frame] for block_id, frame in self._frame_of.items() if block_id in held],
            "next_pos": self._next_pos,
            "summary_block": self.summary.block_id if self.summary is not None and self.summary in store else None,
            "summary_count": list(self._summary_count),
            "reindexed": self.reindexed,
            "compressions": self.compressions,
        }
        return {"meta": meta, "tensors": {}}

    def load_state_dict(self, state, blocks) -> None:
        """The summary token is found in the store once it holds the restored blocks (``after_restore``)."""
        meta = state["meta"]
        frame_of = {int(block_id): int(frame) for block_id, frame in meta["frame_of"]}
        counts = [int(c) for c in meta["summary_count"]]
        if len(counts) != self.n_layers:
            raise ValueError(f"summary counts for {len(counts)} layers, the model has {self.n_layers}")
        summary_id = None
        if meta["summary_block"] is not None:
            summary_id = int(meta["summary_block"])
            summary = blocks[summary_id]
            deep = [l for l, role in enumerate(self.roles) if role == "deep"]
            held = [l for l, kv in enumerate(summary["layers"]) if kv is not None]
            if summary["kind"] != "summary" or held != deep:
                raise ValueError(
                    f"the summary token (block {summary_id}) is in layers {held}, but memory.hermes makes "
                    f"layers {deep} the deep ones"
                )
        ageless = [i for i, b in blocks.items() if b["kind"] != "summary" and i not in frame_of]
        if ageless:
            raise ValueError(f"blocks {ageless} have no frame index (their age)")
        next_pos = None if meta["next_pos"] is None else int(meta["next_pos"])
        self._frames, self._frame_of, self._next_pos = int(meta["frames"]), frame_of, next_pos
        self.summary, self._restored_summary, self._summary_count = None, summary_id, counts
        self.reindexed, self.compressions = int(meta["reindexed"]), int(meta["compressions"])

    def without_blocks(self, state, lost):
        """Ages of lost blocks dropped; a lost summary token goes with its fold counts (the next fold
        starts a new one, as after a reset): the deep layers' pruned tokens it held are what is lost."""
        meta = dict(state["meta"])
        meta["frame_of"] = [[block_id, frame] for block_id, frame in meta["frame_of"] if int(block_id) not in lost]
        if meta["summary_block"] is not None and int(meta["summary_block"]) in lost:
            meta["summary_block"], meta["summary_count"] = None, [0] * len(meta["summary_count"])
        return {"meta": meta, "tensors": state["tensors"]}

    def after_restore(self, store: BlockStore) -> None:
        """Find the summary token among the restored blocks; then, a smaller ``budget_tokens`` than the
        snapshot's: compress every layer to it, as after a chunk."""
        if self._restored_summary is not None:
            self.summary = next(b for b in store.blocks() if b.block_id == self._restored_summary)
            self._restored_summary = None
        self._enforce_layer_budget(store, not self.script or self._frames % self.cfg.chunk_frames == 0)  # as the stream would

    # --- placement ------------------------------------------------------------
    def layout(self, sink_len, per_layer):
        if self.cfg.reindex == "eager":
            return pack_layout(self.adapter, sink_len, per_layer)
        targets, end = logical_layout(sink_len, per_layer)
        return targets, max(end, self._next_pos or sink_len)

    def encoding_context(self, store: BlockStore, job: EncodeJob) -> list[FrameBlock]:
        return sorted(store.blocks(Tier.RESIDENT), key=lambda b: b.order)

    # --- compression ----------------------------------------------------------
    def after_encode(self, store: BlockStore, job: EncodeJob, blocks: list[FrameBlock]) -> None:
        before = self._frames
        for block in blocks:
            self._frame_of[block.block_id] = self._frames
            self._frames += 1
            self._next_pos = max(self._next_pos or 0, int(block.positions.max()) + 1)
        # script: compress at a chunk's end only (or, a batch larger than a chunk, beyond budget + a chunk).
        self._enforce_layer_budget(store, not self.script or before // self.cfg.chunk_frames != self._frames // self.cfg.chunk_frames)
        if self.cfg.reindex == "lazy" and self._next_pos > self.cfg.reindex_at * self.adapter.max_positions:  # departure P9: the script, max - 1024
            self._reindex(store)

    def _enforce_layer_budget(self, store: BlockStore, chunk_end: bool = True) -> None:
        """Once a layer holds more than its budget (at a chunk's end), compress every layer."""
        held = [b for b in store.blocks(Tier.RESIDENT) if b is not self.summary]  # P8: the summary is never scored
        over = 0 if chunk_end else self.cfg.chunk_frames * self.adapter.tokens_per_frame
        if any(sum(b.layer_tokens(l) for b in held) > self._regular_budget(l) + over for l in range(self.n_layers)):
            self._compress(store, sorted(held, key=lambda b: b.order))
            # Forget the ages of blocks compressed away in every layer: a days-long stream must not grow this.
            self._frame_of = {b.block_id: self._frame_of[b.block_id] for b in store.blocks() if b.block_id in self._frame_of}

    def _regular_budget(self, layer: int) -> int:
        """Tokens a layer keeps besides its summary token."""
        return self.budget - (1 if self.cfg.summary_token and self.roles[layer] == "deep" else 0)

    def _compress(self, store: BlockStore, held: list[FrameBlock]) -> None:
        self.compressions += 1
        per_layer = present_in(held, self.n_layers)
        targets, next_pos = self.layout(self.sink_len, per_layer)
        scores, ids = [], []
        live = None
        if self.cfg.pseudo_queries == "live":  # HERMES' script: its queries through the model over the live cache
            live = {"deep": self.host.pseudo_attention(self.cfg.global_query, per_layer, targets, next_pos),
                    "middle": self.host.pseudo_attention(mixed_query(self.cfg.local_query, self.cfg.global_query), per_layer, targets, next_pos)}
        for layer, blocks in enumerate(per_layer):
            ages = torch.cat([torch.full((b.layer_tokens(layer),), float(self._frames - 1 - self._frame_of[b.block_id])) for b in blocks])
            ids.append(torch.cat([b.block_id * TOKEN_ID_STRIDE + b.kept(layer).index for b in blocks]))
            if self.cfg.recency == "token":  # script: token j of N scores exp(-k (N-1-j) / (N-1)), newest 0
                ages = torch.arange(ages.numel() - 1, -1, -1, dtype=ages.dtype)
            attn = None
            if live is not None and self.roles[layer] != "shallow":
                attn = live[self.roles[layer]][layer]
            elif self.roles[layer] != "shallow":
                keys = self.host.placed_keys(blocks, targets[layer], layer)  # (1, H, S + N, D)
                q = self.pseudo[layer]  # (n, H_q, D)
                q_pos = self.adapter.text_positions(next_pos, q.shape[0])
                q_rot = self.adapter.rotate_keys(q.transpose(0, 1), q_pos).to(keys.dtype)  # (H_q, n, D)
                attn = pseudo_query_attention(q_rot.float(), keys[0].float(), self.adapter.geometry.head_dim**-0.5)
                attn = attn[self.sink_len :].cpu()
            w = omega(layer, *self._middle, self.cfg.omega0, self.cfg.omega_gamma)
            rate = self.cfg.recency_rate
            if self.roles[layer] == "middle":  # script: k = 20 - 19.5 * depth; robot: recency_rate_deep = recency_rate
                rate = schedule_rate(layer, *self._middle, self.cfg.recency_rate, self.cfg.recency_rate_deep)
            decay = rate / max(float(ages.max()), 1.0)
            scores.append(layer_scores(self.roles[layer], attn, recency_scores(ages, decay), w))
        lam = [getattr(self.cfg, f"smoothing_{role}") for role in self.roles[:-1]] + [0.0]
        smoothed = cross_layer_smooth(scores, ids, lam)
        for layer, blocks in enumerate(per_layer):
            n_keep = self._regular_budget(layer) - self.headroom  # room for the rest of the next chunk
            if ids[layer].numel() <= n_keep:
                continue
            kept = torch.zeros(ids[layer].numel(), dtype=torch.bool)
            kept[top_k_stable(smoothed[layer], n_keep)] = True  # ties: the earlier token
            at = 0
            for block in blocks:
                t = block.layer_tokens(layer)
                mask = kept[at : at + t]
                at += t
                if bool(mask.all()):
                    continue
                if self.cfg.summary_token and self.roles[layer] == "deep":
                    self._fold(store, block, layer, ~mask)
                store.keep(block, layer, mask.nonzero().flatten())

    def _fold(self, store: BlockStore, block: FrameBlock, layer: int, pruned: torch.Tensor) -> None:
        """Fold ``block``'s pruned tokens of a deep ``layer`` into that layer's summary token."""
        keys, values = store.layer_kv(block, layer)  # (H, t, D)
        sel = pruned.nonzero().flatten()
        stored = block.positions[:, block.kept(layer).index[sel]]  # (P, p)
        target = self.adapter.text_positions(self.sink_len, 1)  # (P, 1)
        aligned = self.adapter.rotate_keys(keys[:, sel.to(keys.device)], target - stored)  # (H, p, D) at the summary's position
        summary = self._ensure_summary(store, keys)
        sum_keys, sum_values = summary.kept(layer).resident_kv()  # a deep layer's, resident (P8)
        prev = None
        if self._summary_count[layer]:
            prev = (sum_keys[:, 0].float(), sum_values[:, 0].float(), self._summary_count[layer])
        k, v, count = summary_token(
            aligned.float(), values[:, sel.to(values.device)].float(), torch.zeros(sel.numel(), dtype=torch.long), 0, lambda x, d: x, prev
        )
        self._summary_count[layer] = count
        store.replace_layer(summary, layer, k[:, None].to(sum_keys.dtype), v[:, None].to(sum_values.dtype))

    def _ensure_summary(self, store: BlockStore, like: torch.Tensor) -> FrameBlock:
        """The summary block, held in ``store``: made there (zero K/V in its deep layers) if it is not."""
        if self.summary is not None and self.summary in store:
            return self.summary
        H, _, D = like.shape
        pos = self.adapter.text_positions(self.sink_len, 1)
        layers = [
            LayerKV(torch.zeros(1, dtype=torch.long), pos.clone(), torch.zeros(H, 1, D, dtype=like.dtype, device=like.device),
                    torch.zeros(H, 1, D, dtype=like.dtype, device=like.device))
            if role == "deep" else None
            for role in self.roles
        ]
        summary = self.summary = FrameBlock(
            block_id=self.host.new_block_id(),
            camera="",
            stamp_ns=0,
            positions=pos,
            key_mean=torch.zeros(self.n_layers, H, D),
            layers=layers,
            kind="summary",
            rank=-1,
            protected=True,
        )
        self._summary_count = [0] * self.n_layers
        store.add(summary)
        return summary

    def _reindex(self, store: BlockStore) -> None:
        """Lazy re-indexing: compact every layer's logical positions after the sink."""
        blocks = sorted(store.blocks(Tier.RESIDENT), key=lambda b: b.order)
        per_layer = present_in(blocks, self.n_layers)
        targets, end = pack_layout(self.adapter, self.sink_len, per_layer)
        for layer, (bs, ts) in enumerate(zip(per_layer, targets)):
            for block, target in zip(bs, ts):
                store.set_logical(block, layer, target)
        self._next_pos = end
        self.reindexed += 1

    # --- questions ------------------------------------------------------------
    def select(self, host: PolicyHost, candidates: Candidates, question: str) -> Static:
        chosen = [b for b in candidates.blocks() if b.tier is Tier.RESIDENT]
        if self.summary is not None and self.summary in host.store and self.summary not in chosen:
            chosen.append(self.summary)
        return Static.everywhere(chosen, self.n_layers)
