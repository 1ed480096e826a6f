"""Ingest after the vision stage: the decoder, the policy's steps and the caps, frame by frame.

The flow (ReKV's): frame -> [still-frame test] -> vision tower (``vision_stage.py``) -> policy.on_frame -> encode
jobs -> decoder over [sink + policy.encoding_context] (``ModelRunner``) -> blocks -> policy.after_encode
(compression) -> BlockStore -> caps (``caps.py``). Where the policy allows (``batch_window``), up to
``memory.prefill_batch`` frames go through the decoder in one pass, each exactly as alone
(``context/batch_prefill.py``); the policy's steps, the caps and the counters then follow frame by frame.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from videokv_node.memory.context.encoding import EncodeJob, Unit
from videokv_node.memory.context.model_runner import ModelRunner
from videokv_node.memory.frames.caps import enforce_caps
from videokv_node.memory.frames.still import StillFilter, span_of
from videokv_node.memory.frames.vision_stage import PreparedFrames
from videokv_node.memory.policies.base import MemoryPolicy, PolicyHost
from videokv_node.memory.question import Frame
from videokv_node.memory.records.clock import elapsed_s
from videokv_node.memory.records.engine_settings import EngineSettings
from videokv_node.memory.stats import LatencyWindow
from videokv_node.memory.store.block import FrameBlock
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.memory.store.frame_tables import FrameTables


class IngestPipeline:
    """Frames into memory (the engine's thread only; ``lock`` guards the store against the stats' readers).

    Guarantees: after ``ingest`` (and ``enforce_caps``) returns, the resident budget holds; every frame
    handed in is counted in ``ingested`` (merged still frames too) and its time in ``ingest_ms``; the frame
    tables are pruned to what memory cites or may still cite."""

    def __init__(self, runner: ModelRunner, store: BlockStore, policy: MemoryPolicy, host: PolicyHost,
                 tables: FrameTables, settings: EngineSettings, lock: threading.Lock) -> None:
        self.runner, self.adapter, self.store, self.policy, self.host = runner, runner.adapter, store, policy, host
        self.tables, self.settings, self.lock = tables, settings, lock
        redundancy = settings.memory.redundancy  # still frames (memory/frames/still.py); None: every frame encoded
        self.still: StillFilter | None = StillFilter(redundancy) if redundancy.enabled else None
        self.ingested = 0  # frames handed in since start (merged ones included); a restore sets it
        self.ingest_ms = LatencyWindow()  # per frame, vision + decoder (or the still test's) milliseconds

    # --- still frames ---------------------------------------------------------
    def merge_still(self, frames: list[Frame]) -> list[Frame]:
        """The frames to encode; the still ones extend their stored frame's blocks now, each counted as
        ingested with its (tiny) cost in the ingest latencies. Off: ``frames`` itself."""
        if self.still is None or not frames:
            return frames
        t0 = time.perf_counter()
        kept, grown = self.still.split(frames, self.store.__contains__)
        self._extend_spans(grown)
        merged = len(frames) - len(kept)
        if merged:
            ms = (time.perf_counter() - t0) * 1e3 / len(frames)  # the test's cost per frame, kept ones included
            for _ in range(merged):
                self.ingest_ms.add(ms)
            self.ingested += merged
        return kept

    def _extend_spans(self, stored_frames) -> None:
        with self.lock:
            for stored in stored_frames:
                for block in stored.blocks:
                    if block in self.store:
                        self.store.extend_span(block, *span_of(stored))

    # --- the decoder, the policy, the caps -------------------------------------
    def ingest(self, prepared: PreparedFrames, between: Callable[[], None] | None = None) -> list[FrameBlock]:
        """The rest of ingest after the vision stage; returns the blocks made (some may be evicted already).
        ``between()`` runs after each batch but the last, the memory complete up to its last frame."""
        frames = prepared.frames
        feats, vision_ms = prepared.vision.result()  # (F, T, hidden); raises what the vision encoder raised
        if not frames:
            return []
        keys = [(f.camera, f.stamp_ns) for f in frames]
        self.tables.note(keys, [f.pose for f in frames], self.adapter.frame_words(feats))
        offsets = self.adapter.frame_positions(0)  # (P, T)
        units = [Unit(feat=feat, offsets=offsets, camera=f.camera, stamp_ns=f.stamp_ns) for f, feat in zip(frames, feats)]
        window = self.policy.batch_window()
        step = self.settings.memory.prefill_batch if window is not None else 1
        blocks: list[FrameBlock] = []
        for at in range(0, len(units), step):
            if at and between is not None:
                between()
            t1 = time.perf_counter()
            chunk = units[at:at + step]
            batch = self.runner.prefill_batch(chunk, window) if len(chunk) > 1 and window is not None else None  # > 1: a window
            for i, unit in enumerate(chunk):
                self.ingested += 1
                if batch is None:
                    for job in self.policy.on_frame(self.store, unit):
                        blocks.extend(self.store_job(job, self.runner.encode_units(job)))
                else:
                    batch.check_window(i, blocks[len(blocks) - i:], self.policy.encoding_context(self.store, EncodeJob([])))
                    blocks.extend(self.store_job(*self.runner.batch_block(batch, i, unit)))
                self.policy.after_frame(self.host)
                self.enforce_caps()
                self.runner.place_resident()
            for _ in chunk:  # the chunk's time shared by its frames
                self.ingest_ms.add(vision_ms + elapsed_s(t1, self.adapter.device) * 1e3 / len(chunk))
        if self.still is not None:  # new blocks join their stored frame's span (a StreamKV segment closes after frames merged into it)
            self._extend_spans(self.still.made(blocks))
        self.prune_tables()
        return blocks

    def store_job(self, job: EncodeJob, blocks: list[FrameBlock]) -> list[FrameBlock]:
        """Add a job's blocks (with their frames' words) to the store, then the policy compresses and the caps hold."""
        with self.lock:
            for block in blocks:
                block.words = block.words or self.tables.words_of(block)
                self.store.add(block)
            self.policy.after_encode(self.store, job, blocks)
            self.enforce_caps_locked()
        return blocks

    def enforce_caps(self) -> None:
        """Demote or evict, oldest first, until the resident budget holds (``caps.py``)."""
        with self.lock:
            self.enforce_caps_locked()

    def enforce_caps_locked(self) -> None:
        """``enforce_caps`` with the lock already held."""
        enforce_caps(self.store, self.policy, self.settings.memory.budget_tokens, self.runner.sink.n_tokens,
                     self.adapter.geometry.n_layers)

    def prune_tables(self) -> None:
        """Forget the poses and words of frames neither pending nor cited by a block in memory (``FrameTables.prune``)."""
        if not self.tables.stale(self.store):  # O(1) unless something was evicted since
            return
        pending = [(u.camera, s) for u in self.policy.pending_units() for s in (u.stamps_ns or (u.stamp_ns,))]
        with self.lock:
            self.tables.prune(self.store, pending)

    def reset(self) -> None:
        """Forget every frame's trace here: the still filter's stored frames (its count stays), the latencies."""
        self.still = None if self.still is None else StillFilter(self.still.config, self.still.frames_merged)
        self.ingest_ms.clear()
