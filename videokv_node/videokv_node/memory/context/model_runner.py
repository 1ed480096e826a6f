"""The one object that runs the model for the memory: every decoder pass of memory/ goes through it.

nano-vllm's ``ModelRunner`` is the only thing there that runs the model; ours is the only thing in memory/ that
runs the decoder for the memory's sake: the prompt sink, the frames' encoding (one job, or a batch of frames
each as alone), a text's queries read after the sink (``probe``), a shortlist re-read block by block
(``read_alone``: ``~/locate``'s re-ranking and ReKV's), and HERMES' pseudo-queries over the live cache
(``pseudo_attention``) or its placed keys (``placed_keys``). A policy reaches these through ``PolicyHost``
(``memory/policies/host.py``), never the adapter's ``forward``; scoring/ runs no model at all. A question's own
pass (prefill, continuations, decoding) is fed here too (``feed_text``), by the question side (``memory/questions/``).

What it asks of the policy is ``EncodingPlan``: the encoding context, the layout and the encode observer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from transformers.cache_utils import DynamicCache

from videokv_node.memory.context.batch_prefill import BatchPrefill, build_blocks, prefill
from videokv_node.memory.context.encoding import EncodeJob, Unit
from videokv_node.memory.context.resident_cache import ResidentCache
from videokv_node.memory.context.retrieval_cache import QueryCapture, Sink, Targets, place_layer, placed_cache
from videokv_node.memory.store.block import FrameBlock, present_in
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.memory.store.frame_tables import FrameTables
from videokv_node.memory.store.words import subject_of
from videokv_node.models.adapter import VideoLLMAdapter
from videokv_node.models.attention import AttentionObserver, attention_probs

REREAD_BATCH = 8  # blocks re-read in one forward: bounds the logits held at once (8 x tokens x vocab)


class EncodingPlan(Protocol):
    """What the runner asks of the policy (``MemoryPolicy`` has these three)."""

    def encoding_context(self, store: BlockStore, job: EncodeJob) -> list[FrameBlock]: ...

    def layout(self, sink_len: int, per_layer: Sequence[Sequence[FrameBlock]]) -> tuple[Targets, int]: ...

    def encode_observer(self, job: EncodeJob) -> AttentionObserver | None: ...


class ModelRunner:
    """The decoder's passes for the memory, over caches placed from the store (the engine's thread only).

    Guarantees: block ids only increase (``new_block_id``, encoding), provisional blocks spend none; nothing
    here adds to or removes from the store; ``resident`` (the cache kept placed for ``full`` and ``hermes``,
    ``context/resident_cache.py``) is the only cache kept between calls. ``sink`` raises once closed
    (``release_sink``): nothing runs the model after ``close``."""

    def __init__(self, adapter: VideoLLMAdapter, store: BlockStore, plan: EncodingPlan, tables: FrameTables) -> None:
        self.adapter = adapter
        self.store = store
        self.plan = plan  # the policy, as far as encoding goes
        self.tables = tables  # the frames' poses, read when a block is made
        self.next_block_id = 0  # the id the next block gets; changed by new_block_id, encoding and a restore
        self._sink: Sink | None = self._encode_sink()  # None once released (the engine's ``close``)
        self.resident: ResidentCache | None = None  # set by the engine where the policy keeps its context placed

    @property
    def sink(self) -> Sink:
        """The prompt sink's K/V (L, H, S, D); RuntimeError once released (a closed engine)."""
        if self._sink is None:
            raise RuntimeError("the prompt sink was released: the engine is closed")
        return self._sink

    @property
    def held_sink(self) -> Sink | None:
        """The prompt sink, or None once released: for readers that outlive ``close`` (the stats)."""
        return self._sink

    def release_sink(self) -> None:
        """Drop the prompt sink's K/V (the engine's ``close``); every pass after it raises."""
        self._sink = None

    @torch.inference_mode()
    def _encode_sink(self) -> Sink:
        ids = self.adapter.prefix_ids()  # departure P11 (docs/POLICIES.md): ours under both presets, no seed's system prompt
        cache = DynamicCache()
        self.adapter.forward(self.adapter.embed_tokens(ids), self.adapter.text_positions(0, len(ids)), cache, logits=False)
        keys = torch.stack([layer.keys[0] for layer in cache.layers])  # (L, H, S, D)
        values = torch.stack([layer.values[0] for layer in cache.layers])
        return Sink(keys, values)

    def new_block_id(self) -> int:
        """An id for a block a policy creates itself (HERMES' summary token)."""
        self.next_block_id += 1
        return self.next_block_id - 1

    def plan_of(self, context: Sequence[FrameBlock]) -> tuple[list[list[FrameBlock]], Targets, int]:
        """Per layer, the blocks of ``context`` there, where they stand (the policy's layout), the next position."""
        per_layer = present_in(context, self.adapter.geometry.n_layers)
        targets, start = self.plan.layout(self.sink.n_tokens, per_layer)
        return per_layer, targets, start

    def place(self, per_layer, targets) -> DynamicCache:
        """The cache of a plan: from the resident cache (updated in place) where the policy keeps one."""
        resident = self.resident
        return resident.cache(per_layer, targets) if resident is not None else placed_cache(self.adapter, self.store, self.sink, per_layer, targets)

    def place_resident(self) -> None:
        """Bring the resident cache to the next frame's encoding context now, so that the next ingest and
        a question in between (the same context for ``full`` and ``hermes``) find it placed."""
        if self.resident is None:
            return
        per_layer, targets, _ = self.plan_of(self.plan.encoding_context(self.store, EncodeJob([])))
        self.resident.sync(per_layer, targets)

    def resident_restart(self) -> None:
        """Rebuild the resident cache from the store (a restored or failed-to-restore memory)."""
        if self.resident is not None:
            self.resident.clear()
            self.place_resident()

    @torch.inference_mode()
    def encode_units(self, job: EncodeJob, provisional: bool = False) -> list[FrameBlock]:
        """Run the decoder over a job's units after its context; returns blocks not yet in the store.

        ``provisional``: blocks held outside the store for now (StreamKV's open segment) get
        negative ids, distinct within the job (-1, -2, ... in order, ``job.ready`` first), so they
        spend no block id; a job that is not provisional gives its ready blocks real ids first.
        """
        if not provisional:
            for block in job.ready:
                if block.block_id < 0:
                    block.block_id = self.new_block_id()
        if not job.units:
            return list(job.ready)
        per_layer, targets, start = self.plan_of(self.plan.encoding_context(self.store, job) + job.ready)
        cache = self.place(per_layer, targets) if not job.ready else placed_cache(self.adapter, self.store, self.sink, per_layer, targets)
        positions = []
        for unit in job.units:
            positions.append(unit.offsets + start)
            start += unit.span
        embeds = torch.cat([u.feat for u in job.units])[None]  # (1, n, hidden)
        all_pos = torch.cat(positions, dim=1)  # (P, n)
        n = all_pos.shape[1]
        self.adapter.forward(embeds, all_pos, cache, logits=False, observer=self.plan.encode_observer(job))
        keys = torch.stack([layer.keys[0, :, -n:] for layer in cache.layers])  # (L, H, n, D)
        values = torch.stack([layer.values[0, :, -n:] for layer in cache.layers])
        first = -(len(job.ready) + 1) if provisional else self.next_block_id
        ids = [first - i for i in range(len(positions))] if provisional else [first + i for i in range(len(positions))]
        self.next_block_id += 0 if provisional else len(ids)
        blocks = build_blocks(self.adapter, job, positions, keys, values, ids, self.tables.poses)
        return list(job.ready) + blocks

    def prefill_batch(self, units: list[Unit], window: int) -> BatchPrefill:
        """Units prefilled in one pass after the first one's context (``memory/context/batch_prefill.py``)."""
        context = self.plan.encoding_context(self.store, EncodeJob(units[:1]))
        _, targets, start = self.plan_of(context)
        return prefill(self.adapter, self.store, self.sink, context, targets, start, units, window)

    def batch_block(self, batch: BatchPrefill, i: int, unit: Unit) -> tuple[EncodeJob, list[FrameBlock]]:
        """The ``i``-th unit of a batch prefill as a one-frame job and its block, given the next id."""
        job = EncodeJob([unit])
        blocks = build_blocks(self.adapter, job, [batch.positions[i]], batch.keys[i], batch.values[i], [self.next_block_id], self.tables.poses)
        self.next_block_id += 1
        return job, blocks

    @torch.inference_mode()
    def feed_text(self, ids: list[int], start: int, cache: DynamicCache, observer: AttentionObserver | None = None,
                  n_logits: int = 1) -> torch.Tensor:
        """Text tokens ``ids`` fed from position ``start`` on over ``cache`` (appended to): a question's prefill,
        a continuation, a decoded token. Returns the last ``n_logits`` tokens' logits (``VideoLLMAdapter.forward``)."""
        adapter = self.adapter
        return adapter.forward(adapter.embed_tokens(ids), adapter.text_positions(start, len(ids)), cache,
                               observer=observer, n_logits=n_logits)

    @torch.inference_mode()
    def probe(self, text: str) -> torch.Tensor:
        """(L, n, H_q, D) pre-RoPE queries of ``text`` read right after the prompt sink.

        Policies that score memory against a text before or without the real pass (StreamKV's guidance
        prompt and layer-adaptive retrieval, HERMES' pseudo query, MuKV's question vector) read its
        queries here, in the context of the prompt only: the same context for every memory."""
        ids = self.adapter.text_ids(text)
        geo = self.adapter.geometry
        capture = QueryCapture(geo.n_q_heads, geo.n_kv_heads, geo.head_dim, keep_all=True)
        cache = placed_cache(self.adapter, self.store, self.sink, [[] for _ in range(geo.n_layers)], [[] for _ in range(geo.n_layers)])
        with capture.attached(self.adapter.query_modules()):
            self.adapter.forward(
                self.adapter.embed_tokens(ids), self.adapter.text_positions(self.sink.n_tokens, len(ids)), cache, logits=False
            )
        return torch.stack([capture.all(layer) for layer in range(geo.n_layers)])

    @torch.inference_mode()
    def read_alone(self, blocks: Sequence[FrameBlock], prompt: str, text: str) -> list[float]:
        """Per block, the mean log-probability per token (natural log) of the query ``text``'s subject
        (``subject_of``) as the answer to the open question ``prompt`` asked over the prompt sink and that
        block alone (its kept tokens in each layer, placed by the policy's layout as for a question). Blocks
        that keep the same tokens per layer and are placed alike are read together, ``REREAD_BATCH`` at a
        time: one decoder forward of the prompt and the subject's tokens per batch, each row over its own
        block's cache (the rows share positions and mask, so each equals a forward of its block alone);
        the cache is dropped after it. Memory is not changed."""
        adapter, sink = self.adapter, self.sink
        cont = adapter.text_ids(subject_of(text))
        feed = adapter.question_ids(prompt, []) + cont[:-1]  # the last token's successor is never needed
        embeds = adapter.embed_tokens(feed)
        n_layers = adapter.geometry.n_layers
        plans: list[tuple[list[list[FrameBlock]], Targets]] = []
        groups: dict[tuple[tuple[int, ...], int], list[int]] = {}  # (tokens per layer, next position) -> blocks
        for i, block in enumerate(blocks):
            per_layer, targets, next_pos = self.plan_of([block])
            plans.append((per_layer, targets))
            shape = tuple(block.layer_tokens(l) if per_layer[l] else 0 for l in range(n_layers))
            groups.setdefault((shape, next_pos), []).append(i)
        out = [0.0] * len(blocks)
        picked = torch.tensor(cont, device=embeds.device)[:, None]  # the subject's tokens, where the logits are
        for (_, next_pos), members in groups.items():
            for at in range(0, len(members), REREAD_BATCH):
                rows = members[at:at + REREAD_BATCH]
                layers = []
                for l in range(n_layers):
                    kv = [place_layer(adapter, self.store, sink, plans[i][0][l], plans[i][1][l], l) for i in rows]
                    layers.append((torch.cat([k for k, _ in kv]), torch.cat([v for _, v in kv])))
                logits = adapter.forward(embeds.expand(len(rows), -1, -1), adapter.text_positions(next_pos, len(feed)),
                                         DynamicCache(ddp_cache_data=layers), n_logits=len(cont))
                if logits is None:  # asked for (logits=True): None would be the adapter's bug
                    raise RuntimeError("the adapter returned no logits for a re-read")
                logits = logits.reshape(len(rows), len(cont), -1)
                for row, i in enumerate(rows):  # one row at a time in float64: (n, vocab) each
                    out[i] = float(torch.log_softmax(logits[row].double(), dim=-1).gather(1, picked).mean())
        return out

    @torch.inference_mode()
    def pseudo_attention(self, text: str, per_layer: Sequence[Sequence[FrameBlock]], targets: Targets,
                         start_pos: int) -> list[torch.Tensor]:
        """Per layer, (N_l,) float32 on CPU: the attention ``text``'s tokens pay to each non-sink token of a
        cache of the sink and ``per_layer[l]`` placed at ``targets[l]``, the text placed from ``start_pos`` on
        (HERMES' script's ``pseudo_forward``, docs/POLICIES.md). Each layer's vector is the mean over query
        heads and query tokens of the causal softmax over all keys, read at the cached tokens: it sums to at
        most 1 (the rest went to the sink and the query's own tokens). The cache is built for the call and
        dropped with the text's KV."""
        adapter, sink_len = self.adapter, self.sink.n_tokens
        ids = adapter.text_ids(text)
        scores: dict[int, torch.Tensor] = {}

        def observe(layer: int, query: torch.Tensor, key: torch.Tensor, scale: float) -> None:
            n_q, n_k = query.shape[2], key.shape[2]
            probs = attention_probs(query, key, scale)  # (H_q, n_q, K) with K = sink + N_l + n_q
            scores[layer] = probs[:, :, sink_len : n_k - n_q].mean(dim=(0, 1)).cpu()  # (N_l,)

        cache = placed_cache(adapter, self.store, self.sink, per_layer, targets)
        adapter.forward(adapter.embed_tokens(ids), adapter.text_positions(start_pos, len(ids)), cache, logits=False, observer=observe)
        return [scores[layer] for layer in range(adapter.geometry.n_layers)]

    def placed_keys(self, blocks: Sequence[FrameBlock], targets: Sequence[torch.Tensor], layer: int) -> torch.Tensor:
        """(1, H, S + N, D) keys of layer ``layer``: the sink, then ``blocks`` placed at ``targets`` (no pass run)."""
        keys, _ = place_layer(self.adapter, self.store, self.sink, blocks, targets, layer)
        return keys
