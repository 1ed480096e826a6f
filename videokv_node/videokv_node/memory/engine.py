"""The video memory engine: frames in, bounded KV memory held, questions answered from it.

One thread owns an engine (the node's model worker); ``stats()`` may be read
from any thread. The flow, ReKV's, with the policy deciding at each step:

    frame -> vision tower -> decoder over [sink + policy.encoding_context] -> one FrameBlock
          -> BlockStore -> caps enforced (policy picks the victims)
    question -> candidates (camera / time filter) -> policy.question_selection
             -> one prefill pass, each layer attending to its own blocks -> answer
"""

from __future__ import annotations

import threading
import time

import torch
from transformers.cache_utils import DynamicCache

from videokv_node.memory.block import FrameBlock, Tier
from videokv_node.memory.block_store import BlockStore
from videokv_node.memory.config import ConfigError, GenerationConfig, MemoryConfig
from videokv_node.memory.policy import QuestionSelection, make_policy
from videokv_node.memory.question import Answer, Evidence, Frame, Question, RequestError
from videokv_node.memory.retrieval_cache import (
    QueryCapture,
    RetrievingCache,
    Sink,
    place_layer,
    placed_cache,
    top_k_blocks,
)
from videokv_node.memory.stats import EngineStats, LatencyWindow
from videokv_node.models.adapter import VideoLLMAdapter


class VideoMemoryEngine:
    """A bounded KV memory of a camera stream over one Video-LLM.

    Guarantees, however long the stream: resident tokens (sink included) never
    exceed ``budget_tokens`` after ``ingest`` returns, offloaded bytes never
    exceed ``offload_bytes``, and every block that leaves memory is counted in
    ``frames_evicted``. A refused question (``RequestError``) changes nothing.
    """

    def __init__(self, adapter: VideoLLMAdapter, memory: MemoryConfig, generation: GenerationConfig) -> None:
        self.adapter = adapter
        self.config = memory
        self.generation = generation
        self.policy = make_policy(memory)
        offload = memory.offload_bytes if self.policy.uses_offload else 0
        self.store = BlockStore(adapter.geometry, adapter.device, offload, memory.page_tokens)
        self.sink = self._encode_sink()
        need = self.sink.n_tokens + memory.local_window_tokens + adapter.tokens_per_frame
        if memory.budget_tokens < need:
            raise ConfigError(
                f"memory.budget_tokens ({memory.budget_tokens}) must hold the prompt sink ({self.sink.n_tokens}), "
                f"the local window ({memory.local_window_tokens}) and one frame ({adapter.tokens_per_frame}): >= {need}"
            )
        self._next_block_id = 0
        self._ingested = 0
        self._ingest_ms = LatencyWindow()
        self._lock = threading.Lock()
        self.last_layer_blocks: list[list[int]] = []  # per layer, block ids the last question attended to
        self._stats = self._snapshot()

    # --- ingest -----------------------------------------------------------
    def ingest(self, frames: list[Frame]) -> list[FrameBlock]:
        """Encode frames (time order) into memory; returns their blocks (some may be evicted already)."""
        if not frames:
            return []
        t0 = time.perf_counter()
        feats = self.adapter.encode_frames([f.rgb for f in frames])  # (F, T, hidden)
        vision_ms = (time.perf_counter() - t0) * 1e3 / len(frames)
        blocks = []
        for frame, feat in zip(frames, feats):
            t1 = time.perf_counter()
            blocks.append(self._ingest_one(frame, feat))
            self._ingest_ms.add(vision_ms + (time.perf_counter() - t1) * 1e3)
        self._stats = self._snapshot()
        return blocks

    @torch.inference_mode()
    def _ingest_one(self, frame: Frame, feat: torch.Tensor) -> FrameBlock:
        context = self.policy.encoding_context(self.store)
        cache, next_pos = placed_cache(self.adapter, self.store, self.sink, context)
        n = feat.shape[0]
        positions = torch.arange(next_pos, next_pos + n)
        self.adapter.forward(feat[None], positions, cache, logits=False)
        keys = torch.stack([layer.keys[0, :, -n:] for layer in cache.layers])  # (L, H, T, D)
        values = torch.stack([layer.values[0, :, -n:] for layer in cache.layers])  # (L, H, T, D)
        # Representative key for retrieval: mean of the *pre-RoPE* keys, so scores do not depend on position.
        key_mean = self.adapter.rotate_keys(keys, -positions).float().mean(dim=2).cpu()  # (L, H, D)
        block = FrameBlock(
            block_id=self._next_block_id,
            camera=frame.camera,
            stamp_ns=frame.stamp_ns,
            positions=positions,
            key_mean=key_mean,
            keys=keys.clone(),
            values=values.clone(),
        )
        self._next_block_id += 1
        self._ingested += 1
        with self._lock:
            self.store.add(block)
            self.policy.after_ingest(self.store, block)
            self._enforce_caps()
        return block

    def _enforce_caps(self) -> None:
        """Demote or evict, as the policy chooses, until the resident budget holds."""
        budget = self.config.budget_tokens - self.sink.n_tokens
        while self.store.resident_tokens > budget:
            victim = self.policy.demotion_victim(self.store)
            if not (self.policy.uses_offload and self.store.can_offload(victim)):
                self.store.evict(victim)
                continue
            while not self.store.arena_has_room(victim):
                self.store.evict(self.policy.offload_victim(self.store))
            self.store.offload(victim)

    # --- questions --------------------------------------------------------
    def validate(self, question: Question) -> list[int]:
        """Refuse a malformed question before any work; returns its token ids."""
        if not question.text.strip():
            raise RequestError("question is empty")
        if any(not opt.strip() for opt in question.options):
            raise RequestError("options must not contain empty strings")
        if len(question.options) == 1:
            raise RequestError("a multiple-choice question needs at least 2 options")
        if len(question.options) > 26:
            raise RequestError("at most 26 options (A-Z)")
        if question.since_ns < 0 or question.until_ns < 0:
            raise RequestError("since and until must not be negative")
        if question.until_ns and question.since_ns > question.until_ns:
            raise RequestError(f"since ({question.since_ns} ns) is after until ({question.until_ns} ns)")
        if question.max_new_tokens < 0:
            raise RequestError("max_new_tokens must not be negative")
        if question.max_new_tokens > self.generation.max_new_tokens_limit:
            raise RequestError(f"max_new_tokens {question.max_new_tokens} exceeds the limit {self.generation.max_new_tokens_limit}")
        ids = self.adapter.question_ids(question.text, question.options)
        if len(ids) > self.config.max_question_tokens:
            raise RequestError(
                f"question is {len(ids)} tokens, longer than the limit of {self.config.max_question_tokens} (memory.max_question_tokens)"
            )
        return ids

    def candidates(self, question: Question) -> list[FrameBlock]:
        cams = set(question.cameras)
        until = question.until_ns or None
        return [
            b
            for b in self.store.blocks()
            if (not cams or b.camera in cams) and b.stamp_ns >= question.since_ns and (until is None or b.stamp_ns <= until)
        ]

    @torch.inference_mode()
    def ask(self, question: Question, on_token=None) -> Answer:
        """Answer from memory. ``on_token(text_so_far)`` is called per generated token if given."""
        t0 = time.perf_counter()
        ids = self.validate(question)
        candidates = self.candidates(question)
        if not candidates:
            what = f"cameras {question.cameras}" if question.cameras else "all cameras"
            raise RequestError(f"no frames in memory for {what} in the requested time window")
        selection = self.policy.question_selection(self.store, candidates)
        geo = self.adapter.geometry
        capture = QueryCapture(geo.n_q_heads, geo.n_kv_heads, geo.head_dim)
        cache, chosen, n_ctx = self._question_cache(selection, capture)
        max_new = 1 if question.options else (question.max_new_tokens or self.generation.max_new_tokens)
        if n_ctx + len(ids) + max_new > self.adapter.max_positions:
            raise RequestError(f"context of {n_ctx + len(ids) + max_new} positions exceeds the model's {self.adapter.max_positions}")
        positions = torch.arange(n_ctx, n_ctx + len(ids))
        with capture.attached(self.adapter.query_modules()):
            logits = self.adapter.forward(self.adapter.embed_tokens(ids), positions, cache)
        ttft = time.perf_counter() - t0
        if question.options:
            letter_ids = self.adapter.option_token_ids(len(question.options))
            probs = torch.softmax(logits[letter_ids], dim=0)
            index = int(torch.argmax(probs))
            text, scores = question.options[index], probs.tolist()
            if on_token:
                on_token(text)
        else:
            text = self._generate(logits, cache, n_ctx + len(ids), max_new, on_token)
            index, scores = -1, []
        evidence = sorted((Evidence(b.stamp_ns, b.camera) for b in chosen.values()), key=lambda e: (e.stamp_ns, e.camera))
        return Answer(text, index, scores, evidence, ttft, time.perf_counter() - t0, n_ctx)

    def _question_cache(self, selection: QuestionSelection, capture: QueryCapture):
        """The cache a question attends to, the blocks it will use (filled as layers run) and the context length.

        ``last_layer_blocks[layer]`` records the block ids each layer attended to (for tests and debugging).
        """
        n_layers = self.adapter.geometry.n_layers
        fixed_tokens = sum(b.n_tokens for b in selection.fixed)
        k = min(selection.k, len(selection.pool))
        if k == len(selection.pool):  # everything fits: no scoring, the same blocks in every layer
            blocks = sorted(selection.fixed + selection.pool, key=lambda b: b.block_id)
            cache, n_ctx = placed_cache(self.adapter, self.store, self.sink, blocks)
            self.last_layer_blocks = [[b.block_id for b in blocks] for _ in range(n_layers)]
            return cache, {b.block_id: b for b in blocks}, n_ctx
        sizes = {b.n_tokens for b in selection.pool}
        if len(sizes) != 1:
            # Per-layer top-k over blocks of different sizes would give layers different lengths,
            # which one causal mask cannot describe. No policy in this engine produces that yet.
            raise RuntimeError("per-layer retrieval needs equal-size blocks in the pool")
        n_ctx = self.sink.n_tokens + fixed_tokens + k * sizes.pop()
        key_means = torch.stack([b.key_mean for b in selection.pool])  # (N, L, H, D)
        chosen: dict[int, FrameBlock] = {b.block_id: b for b in selection.fixed}
        self.last_layer_blocks = [[] for _ in range(n_layers)]

        def materialize(layer: int):
            query = capture.mean(layer).cpu()  # (H, D)
            picked = [selection.pool[i] for i in top_k_blocks(query, key_means[:, layer], k)]
            blocks = sorted(selection.fixed + picked, key=lambda b: b.block_id)
            chosen.update((b.block_id, b) for b in picked)
            self.last_layer_blocks[layer] = [b.block_id for b in blocks]
            return place_layer(self.adapter, self.store, self.sink, blocks, layer)

        return RetrievingCache(n_ctx, materialize, n_layers), chosen, n_ctx

    def _generate(self, logits: torch.Tensor, cache, next_pos: int, max_new: int, on_token) -> str:
        """Greedy decoding; stops at end-of-turn or ``max_new`` tokens."""
        out: list[int] = []
        eos = self.adapter.eos_token_ids
        for step in range(max_new):
            token = int(torch.argmax(logits))
            if token in eos:
                break
            out.append(token)
            if on_token:
                on_token(self.adapter.decode(out))
            if step + 1 == max_new:
                break
            logits = self.adapter.forward(self.adapter.embed_tokens([token]), torch.tensor([next_pos]), cache)
            next_pos += 1
        return self.adapter.decode(out).strip()

    # --- lifecycle and stats ----------------------------------------------
    @torch.inference_mode()
    def _encode_sink(self) -> Sink:
        ids = self.adapter.prefix_ids()
        cache = DynamicCache()
        self.adapter.forward(self.adapter.embed_tokens(ids), torch.arange(len(ids)), cache, logits=False)
        keys = torch.stack([layer.keys[0] for layer in cache.layers])  # (L, H, S, D)
        values = torch.stack([layer.values[0] for layer in cache.layers])
        return Sink(keys, values)

    def reset(self) -> None:
        """Forget every frame; the sink and the lifetime counters stay."""
        with self._lock:
            self.store.clear()
        self._ingest_ms.clear()
        self._stats = self._snapshot()

    def close(self) -> None:
        """Release device and host memory."""
        self.reset()
        self.store.arena = None
        self.sink = None
        if self.adapter.device.type == "cuda":
            torch.cuda.empty_cache()

    def stats(self) -> EngineStats:
        """The latest snapshot (updated after each ingest and reset); never blocks on the model."""
        return self._stats

    def _snapshot(self) -> EngineStats:
        with self._lock:
            blocks = list(self.store.blocks())
            sink = self.sink.n_tokens if self.sink is not None else 0
            resident = self.store.resident_tokens + sink
            arena = self.store.arena
            return EngineStats(
                policy=self.policy.name,
                frames_ingested=self._ingested,
                frames_evicted=self.store.evicted_blocks,
                frames_in_memory=len(blocks),
                tokens_resident=resident,
                tokens_offloaded=self.store.offloaded_tokens,
                bytes_resident=self.store.block_bytes(resident),
                bytes_offloaded=self.store.offloaded_bytes,
                budget_tokens=self.config.budget_tokens,
                budget_offload_bytes=0 if arena is None else arena.capacity_bytes,
                oldest_stamp_ns=min((b.stamp_ns for b in blocks), default=0),
                newest_stamp_ns=max((b.stamp_ns for b in blocks), default=0),
                ingest_ms_p50=self._ingest_ms.percentile(50),
                ingest_ms_p95=self._ingest_ms.percentile(95),
            )
