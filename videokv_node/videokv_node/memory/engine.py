"""The video memory engine: frames in, bounded KV memory held, questions answered from it.

One thread owns an engine (the node's model worker); ``stats()`` may be read from any thread. The flow, ReKV's:

    frame -> vision tower -> policy.on_frame -> encode jobs
          -> decoder over [sink + policy.encoding_context] -> blocks -> policy.after_encode (compression)
          -> BlockStore -> caps enforced (policy picks the victims)
    question -> candidates (camera / time filter) -> policy.select -> Static | InPass
             -> one prefill pass, each layer attending to its own blocks
             -> question stage (TGV-KV eviction) -> answer

Here: construction, run-time configuration, ingest and encoding, the caps, stats. Questions are
``answering.py``'s, the state out and in (and the pose table) ``engine_state.py``'s, still frames
``redundancy.py``'s, ingest's first stage ``vision_stage.py``'s: mixins of the one engine class.
The policy sees it only as ``PolicyHost``.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

import torch
from transformers.cache_utils import DynamicCache

from videokv_node.memory.questions.answering import AnsweringMixin
from videokv_node.memory.context.batch_prefill import BatchPrefill, build_blocks, prefill
from videokv_node.memory.store.block import FrameBlock, Tier
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.memory.records.clock import elapsed_s
from videokv_node.memory.config import ConfigError, GenerationConfig, MemoryConfig, fit_to_model
from videokv_node.memory.context.encoding import EncodeJob, Unit
from videokv_node.memory.snapshot.engine_state import EngineStateMixin
from videokv_node.memory.policies.factory import make_policy
from videokv_node.memory.policies.base import present_in
from videokv_node.memory.policies.host import EngineHost
from videokv_node.memory.question import Frame
from videokv_node.memory.frames.still import StillFilter, StillIngestMixin
from videokv_node.memory.context.question_stage import make_question_stage
from videokv_node.memory.context.resident_cache import ResidentCache
from videokv_node.memory.context.retrieval_cache import QueryCapture, Sink, placed_cache
from videokv_node.memory.stats import EngineStats, LatencyWindow
from videokv_node.memory.frames.vision_stage import PreparedFrames, VisionStageMixin
from videokv_node.models.adapter import VideoLLMAdapter
from videokv_node.pose import Pose


class VideoMemoryEngine(AnsweringMixin, EngineStateMixin, StillIngestMixin, VisionStageMixin):
    """A bounded KV memory of a camera stream over one Video-LLM.

    Guarantees, however long the stream: resident KV (sink included) never
    exceeds ``budget_tokens`` tokens' worth (``budget_tokens x n_layers``
    entries) after ``ingest`` returns, offloaded bytes never exceed
    ``offload_bytes``, and every block that leaves memory is counted in
    ``frames_evicted``. A refused question (``RequestError``) changes nothing, and
    so does a refused state (``load_state_dict``; ``snapshot.load_snapshot``).
    """

    def __init__(self, adapter: VideoLLMAdapter, memory: MemoryConfig, generation: GenerationConfig) -> None:
        self.adapter = adapter
        # Policy defaults the model cannot take are adapted (said in ``adaptations``); set values refused.
        memory, self.adaptations = fit_to_model(memory, adapter.tokens_per_frame)
        self.config = memory
        self.generation = generation
        self.policy = make_policy(memory, adapter)
        self.question_stage = make_question_stage(memory)
        offload = memory.offload_bytes if self.policy.uses_offload else 0
        self.store = BlockStore(adapter.geometry, adapter.device, offload, memory.page_tokens)
        self.sink = self._encode_sink()
        self.check_budget(memory)
        # full and hermes attend to the resident tier as it is: kept placed between steps (memory/context/resident_cache.py).
        self.resident = ResidentCache(adapter, self.store, self.sink, memory.budget_tokens) if self.policy.resident_context else None
        self._next_block_id = self._ingested = 0
        self._ingest_ms = LatencyWindow()
        self._lock = threading.Lock()
        self.still = StillFilter(memory.redundancy) if memory.redundancy.enabled else None  # memory/frames/still.py
        self.last_layer_blocks: list[list[int]] = []  # per layer, block ids the last question attended to
        self.last_layer_token_share: list[dict[int, float]] = []  # per layer, {stamp: share of its tokens attended}
        self._context_len = 0  # largest per-layer context (sink included) of the last question
        # Poses and words of frames by (camera, stamp), read when a block is made or stored (engine_state.py).
        self._frame_poses: dict[tuple[str, int], Pose] = {}
        self._frame_words: dict[tuple[str, int], tuple[str, ...]] = {}
        self._tables_pruned_at = -1  # store.evicted_blocks when the frame tables were last pruned
        self.last_logits: torch.Tensor | None = None
        # What the policy may ask of the engine (memory/policies/host.py): never the engine itself.
        self.host = EngineHost(self.store, self.sink, self.new_block_id, self.encode_units, self.probe, self.read_alone)
        self.policy.setup(self.host)
        self._stats = self._snapshot()

    # --- run-time configuration: the fields of MemoryConfig that may change while the stream runs (the rest
    # shapes the policy, the host arena, the question stage or the still filter, built once at start).
    RUNTIME_FIELDS = ("budget_tokens", "max_question_tokens", "retrieve_frames")

    def check_budget(self, memory: MemoryConfig) -> None:
        """Raise ConfigError unless ``memory.budget_tokens`` holds the prompt sink, the local window
        and one frame, and meets the policy's own rule (HERMES: a chunk); reads only, any thread."""
        need = self.sink.n_tokens + memory.local_window_tokens + self.adapter.tokens_per_frame
        # What the store may hold per layer (HERMES' script rule: its budget + a chunk, the sink apart).
        if self.policy.resident_tokens(memory.budget_tokens, self.sink.n_tokens) < need - self.sink.n_tokens:
            raise ConfigError(
                f"memory.budget_tokens ({memory.budget_tokens}) must hold the prompt sink ({self.sink.n_tokens}), "
                f"the local window ({memory.local_window_tokens}) and one frame ({self.adapter.tokens_per_frame}): >= {need}"
            )
        self.policy.check_budget(memory.budget_tokens, self.sink.n_tokens)

    def reconfigure(self, memory: MemoryConfig, generation: GenerationConfig | None = None) -> None:
        """Adopt a new memory (and generation) config between two frames; the engine's thread only.

        Only ``RUNTIME_FIELDS`` may differ from the current config, and the budget must pass
        ``check_budget``; otherwise ConfigError and nothing changes. A smaller budget is
        enforced at once, as after an ingest: the policy compresses or picks the victims and
        every block that leaves memory is counted in ``frames_evicted``.
        """
        memory, _ = fit_to_model(memory, self.adapter.tokens_per_frame)  # adapted as at start
        kept = {name: getattr(self.config, name) for name in self.RUNTIME_FIELDS}
        if dataclasses.replace(memory, **kept) != self.config:
            raise ConfigError(f"only memory.{', memory.'.join(self.RUNTIME_FIELDS)} may change at run time; the rest needs a restart")
        self.check_budget(memory)
        with self._lock:
            self.config = memory
            self.policy.reconfigure(memory, self.store)
            self._enforce_caps()
        self._place_resident()
        if generation is not None:
            self.generation = generation
        self._stats = self._snapshot()

    # --- ingest -----------------------------------------------------------
    def ingest(self, frames: list[Frame], between: Callable[[], None] | None = None) -> list[FrameBlock]:
        """Encode frames (time order) into memory; returns the blocks made (some may be evicted already).

        A policy that encodes segments may make no block for a frame yet (it waits in the open segment).
        Where the policy allows (``batch_window``), up to ``memory.prefill_batch`` frames are prefilled in
        one pass, each exactly as alone (``context/batch_prefill.py``); the policy's steps, the caps and
        the stats then follow frame by frame, in order. ``between()`` runs after each such chunk but the
        last, the memory complete up to its last frame: a waiting read-only request need not wait for all."""
        return self.ingest_prepared(self.prepare(frames), between)

    def ingest_prepared(self, prepared: PreparedFrames, between: Callable[[], None] | None = None) -> list[FrameBlock]:
        """The rest of ``ingest`` after ``prepare`` (``vision_stage.py``): the decoder, the policy, the caps."""
        frames = prepared.frames
        feats, vision_ms = prepared.vision.result()  # (F, T, hidden); raises what the vision encoder raised
        if not frames:
            return []
        self._frame_words.update(((f.camera, f.stamp_ns), w) for f, w in zip(frames, self.adapter.frame_words(feats)) if w)
        offsets = self.adapter.frame_positions(0)  # (P, T)
        self._frame_poses.update(((f.camera, f.stamp_ns), f.pose) for f in frames if f.pose is not None)
        units = [Unit(feat=feat, offsets=offsets, camera=f.camera, stamp_ns=f.stamp_ns) for f, feat in zip(frames, feats)]
        window = self.policy.batch_window()
        step = self.config.prefill_batch if window is not None else 1
        blocks = []
        for at in range(0, len(units), step):
            if at and between is not None:
                between()
            t1 = time.perf_counter()
            chunk = units[at:at + step]
            batch = self._prefill_batch(chunk, window) if len(chunk) > 1 else None
            for i, unit in enumerate(chunk):
                self._ingested += 1
                if batch is None:
                    for job in self.policy.on_frame(self.store, unit):
                        blocks.extend(self._encode_job(job))
                else:
                    batch.check_window(i, blocks[len(blocks) - i:], self.policy.encoding_context(self.store, EncodeJob([])))
                    job = EncodeJob([unit])
                    new = build_blocks(self.adapter, job, [batch.positions[i]], batch.keys[i], batch.values[i], [self._next_block_id], self._frame_poses)
                    self._next_block_id += 1
                    blocks.extend(self._store_job(job, new))
                self.policy.after_frame(self.host)
                with self._lock:
                    self._enforce_caps()
                self._place_resident()
            for _ in chunk:  # the chunk's time shared by its frames
                self._ingest_ms.add(vision_ms + elapsed_s(t1, self.adapter.device) * 1e3 / len(chunk))
        self._note_still(blocks)
        self._prune_frame_tables()
        self._stats = self._snapshot()
        return blocks

    def _prefill_batch(self, units: list[Unit], window: int) -> BatchPrefill | None:
        """Units prefilled in one pass after the first one's context (``memory/context/batch_prefill.py``)."""
        context = self.policy.encoding_context(self.store, EncodeJob(units[:1]))
        per_layer = present_in(context, self.adapter.geometry.n_layers)
        targets, start = self.policy.layout(self.sink.n_tokens, per_layer)
        return prefill(self.adapter, self.store, self.sink, context, targets, start, units, window)

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
        context = self.policy.encoding_context(self.store, job) + job.ready
        per_layer = present_in(context, self.adapter.geometry.n_layers)
        targets, start = self.policy.layout(self.sink.n_tokens, per_layer)
        cache = self._place(per_layer, targets) if not job.ready else placed_cache(self.adapter, self.store, self.sink, per_layer, targets)
        positions = []
        for unit in job.units:
            positions.append(unit.offsets + start)
            start += unit.span
        embeds = torch.cat([u.feat for u in job.units])[None]  # (1, n, hidden)
        all_pos = torch.cat(positions, dim=1)  # (P, n)
        n = all_pos.shape[1]
        self.adapter.forward(embeds, all_pos, cache, logits=False, observer=self.policy.encode_observer(job))
        keys = torch.stack([layer.keys[0, :, -n:] for layer in cache.layers])  # (L, H, n, D)
        values = torch.stack([layer.values[0, :, -n:] for layer in cache.layers])
        first = -(len(job.ready) + 1) if provisional else self._next_block_id
        ids = [first - i for i in range(len(positions))] if provisional else [first + i for i in range(len(positions))]
        self._next_block_id += 0 if provisional else len(ids)
        blocks = build_blocks(self.adapter, job, positions, keys, values, ids, self._frame_poses)
        return list(job.ready) + blocks

    def _encode_job(self, job: EncodeJob) -> list[FrameBlock]:
        return self._store_job(job, self.encode_units(job))

    def _store_job(self, job: EncodeJob, blocks: list[FrameBlock]) -> list[FrameBlock]:
        with self._lock:
            for block in blocks:
                block.words = block.words or self.words_of(block)
                self.store.add(block)
            self.policy.after_encode(self.store, job, blocks)
            self._enforce_caps()
        return blocks

    def _place(self, per_layer, targets):
        """The cache of a plan: from the resident cache (updated in place) where the policy keeps one."""
        resident = self.resident
        return resident.cache(per_layer, targets) if resident is not None else placed_cache(self.adapter, self.store, self.sink, per_layer, targets)

    def _place_resident(self) -> None:
        """Bring the resident cache to the next frame's encoding context now, so that the next ingest and
        a question in between (the same context for ``full`` and ``hermes``) find it placed."""
        if self.resident is None:
            return
        per_layer = present_in(self.policy.encoding_context(self.store, EncodeJob([])), self.adapter.geometry.n_layers)
        targets, _ = self.policy.layout(self.sink.n_tokens, per_layer)
        self.resident.sync(per_layer, targets)

    def new_block_id(self) -> int:
        """An id for a block a policy creates itself (HERMES' summary token)."""
        self._next_block_id += 1
        return self._next_block_id - 1

    def _enforce_caps(self) -> None:
        """Demote or evict, as the policy chooses, until the resident budget holds."""
        pending = self.policy.pending_entries()  # StreamKV's cached open segment, counted in the budget
        budget = self.policy.resident_tokens(self.config.budget_tokens, self.sink.n_tokens) * self.adapter.geometry.n_layers - pending
        # Never for the pending cache's sake demote the encoding window: the next frames' KV would depend on the caps.
        window = {b.block_id for b in self.policy.encoding_context(self.store, EncodeJob([]))} if pending else set()
        while self.store.resident_entries > budget:
            if pending and self.store.resident_entries <= budget + pending and (
                not self.store.count(Tier.RESIDENT) or self.policy.demotion_victim(self.store).block_id in window
            ):
                break  # only the cache is over: documented in policies/streamkv.py
            victim = self.policy.demotion_victim(self.store)
            if not (self.policy.uses_offload and self.store.can_offload(victim)):
                self.store.evict(victim)
                continue
            while not self.store.arena_has_room(victim):
                self.store.evict(self.policy.offload_victim(self.store))
            self.store.offload(victim)

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

    # --- lifecycle and stats ----------------------------------------------
    @torch.inference_mode()
    def _encode_sink(self) -> Sink:
        ids = self.adapter.prefix_ids()  # departure P11 (docs/POLICIES.md): ours under both presets, no seed's system prompt
        cache = DynamicCache()
        self.adapter.forward(self.adapter.embed_tokens(ids), self.adapter.text_positions(0, len(ids)), cache, logits=False)
        keys = torch.stack([layer.keys[0] for layer in cache.layers])  # (L, H, S, D)
        values = torch.stack([layer.values[0] for layer in cache.layers])
        return Sink(keys, values)

    def reset(self) -> None:
        """Forget every frame; the sink and the lifetime counters stay."""
        with self._lock:
            self.store.clear()
            self.policy.reset()
            self.still = None if self.still is None else StillFilter(self.still.config, self.still.frames_merged)
        if self.resident is not None:
            self.resident.clear()
        self._frame_poses, self._frame_words = {}, {}
        self._ingest_ms.clear()
        self._stats = self._snapshot()

    def close(self) -> None:
        """Release device and host memory."""
        self.reset()
        self.store.arena = None
        self.sink = self.host.sink = None  # the policy's view of it too
        self.resident = None
        if self.adapter.device.type == "cuda":
            torch.cuda.empty_cache()

    def stats(self) -> EngineStats:
        """The latest snapshot (updated after each ingest and reset); never blocks on the model."""
        return self._stats

    def _snapshot(self) -> EngineStats:
        """O(1) in what memory holds: every figure is a counter the store keeps (issue 16)."""
        with self._lock:
            sink = self.sink.n_tokens if self.sink is not None else 0
            n_layers = self.adapter.geometry.n_layers
            resident_entries = self.store.resident_entries + sink * n_layers
            arena = self.store.arena
            oldest, newest = self.store.stamp_range()
            return EngineStats(
                policy=self.policy.name,
                frames_ingested=self._ingested,
                frames_merged=0 if self.still is None else self.still.frames_merged,
                frames_evicted=self.store.evicted_blocks,
                frames_in_memory=len(self.store),
                tokens_resident=-(-resident_entries // n_layers),
                tokens_offloaded=-(-self.store.offloaded_entries // n_layers),
                bytes_resident=self.store.entry_bytes(resident_entries),
                bytes_offloaded=self.store.offloaded_bytes,
                budget_tokens=self.config.budget_tokens,
                budget_offload_bytes=0 if arena is None else arena.capacity_bytes,
                oldest_stamp_ns=oldest,
                newest_stamp_ns=newest,
                ingest_ms_p50=self._ingest_ms.percentile(50),
                ingest_ms_p95=self._ingest_ms.percentile(95),
                streamkv_open_segment_bytes=self.policy.pending_feature_bytes() + self.store.entry_bytes(self.policy.pending_entries()),
            )
