"""The video memory engine: frames in, bounded KV memory held, questions answered from it.

One thread owns an engine (the node's model worker); ``stats()`` may be read
from any thread. The flow, ReKV's, with the policy deciding at each step:

    frame -> vision tower -> policy.on_frame -> encode jobs
          -> decoder over [sink + policy.encoding_context] -> blocks -> policy.after_encode (compression)
          -> BlockStore -> caps enforced (policy picks the victims)
    question -> candidates (camera / time filter) -> policy.question_selection
             -> one prefill pass, each layer attending to its own blocks
             -> question stage (TGV-KV eviction) -> answer
"""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path

import torch
from transformers.cache_utils import DynamicCache

from videokv_node.memory.block import FrameBlock, LayerKV, Tier
from videokv_node.memory.block_index import Candidates
from videokv_node.memory.block_store import BlockStore
from videokv_node.memory.config import OPTION_SCORINGS, ConfigError, GenerationConfig, MemoryConfig, fit_to_model
from videokv_node.memory.locate import AttentionMass, LocateQuery, LocateResult, block_masses, rank_moments
from videokv_node.memory.policy import EncodeJob, QuestionSelection, Unit, make_policy, present_in
from videokv_node.memory.question import Answer, Continuations, Evidence, Frame, Question, RequestError
from videokv_node.memory.question_stage import make_question_stage
from videokv_node.memory.question_span import question_span
from videokv_node.memory.resident_cache import ResidentCache
from videokv_node.memory.retrieval_cache import (
    QueryCapture,
    RetrievingCache,
    Sink,
    place_layer,
    placed_cache,
)
from videokv_node.memory.snapshot import SnapshotInfo, load_snapshot, save_snapshot
from videokv_node.memory.stats import EngineStats, LatencyWindow
from videokv_node.models.adapter import VideoLLMAdapter
from videokv_node.pose import Pose


class VideoMemoryEngine:
    """A bounded KV memory of a camera stream over one Video-LLM.

    Guarantees, however long the stream: resident KV (sink included) never
    exceeds ``budget_tokens`` tokens' worth (``budget_tokens x n_layers``
    entries) after ``ingest`` returns, offloaded bytes never exceed
    ``offload_bytes``, and every block that leaves memory is counted in
    ``frames_evicted``. A refused question (``RequestError``) changes nothing, and
    so does a refused snapshot (``SnapshotError``, ``load``).
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
        # full and hermes attend to the resident tier as it is: kept placed between steps (memory/resident_cache.py).
        self.resident = ResidentCache(adapter, self.store, self.sink, memory.budget_tokens) if self.policy.resident_context else None
        self._next_block_id = 0
        self._ingested = 0
        self._ingest_ms = LatencyWindow()
        self._lock = threading.Lock()
        self.last_layer_blocks: list[list[int]] = []  # per layer, block ids the last question attended to
        self.last_layer_stamps: list[list[int]] = []  # per layer, stamps of the frames the last question attended to
        self._context_len = 0  # largest per-layer context (sink included) of the last question
        # Poses of frames by (camera, stamp): filled from Frame.pose at ingest, read when a block is
        # made (a policy may build a block from frames received earlier), pruned after evictions to
        # the frames still in memory or waiting (``_prune_poses``). Blocks keep their own copy
        # (FrameBlock.poses), the evidence and snapshots read that.
        self._frame_poses: dict[tuple[str, int], Pose] = {}
        self._poses_pruned_at = -1  # store.evicted_blocks when the pose table was last pruned
        self.last_logits: torch.Tensor | None = None
        self.policy.setup(self, self.probe)
        self._stats = self._snapshot()

    # --- run-time configuration -------------------------------------------
    # Fields of MemoryConfig that may change while the stream runs: the rest shapes the
    # policy, the host arena or the question stage, built once at start.
    RUNTIME_FIELDS = ("budget_tokens", "max_question_tokens", "retrieve_frames")

    def check_budget(self, memory: MemoryConfig) -> None:
        """Raise ConfigError unless ``memory.budget_tokens`` holds the prompt sink, the local window
        and one frame, and meets the policy's own rule (HERMES: a chunk); reads only, any thread."""
        need = self.sink.n_tokens + memory.local_window_tokens + self.adapter.tokens_per_frame
        if memory.budget_tokens < need:
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
    def ingest(self, frames: list[Frame]) -> list[FrameBlock]:
        """Encode frames (time order) into memory; returns the blocks made (some may be evicted already).

        A policy that encodes segments may make no block for a frame yet (it waits in the open segment).
        """
        if not frames:
            return []
        t0 = time.perf_counter()
        feats = self.adapter.encode_frames([f.rgb for f in frames])  # (F, T, hidden)
        vision_ms = (time.perf_counter() - t0) * 1e3 / len(frames)
        offsets = self.adapter.frame_positions(0)  # (P, T)
        blocks = []
        for frame in frames:
            if frame.pose is not None:
                self._frame_poses[(frame.camera, frame.stamp_ns)] = frame.pose
        for frame, feat in zip(frames, feats):
            t1 = time.perf_counter()
            unit = Unit(feat=feat, offsets=offsets, camera=frame.camera, stamp_ns=frame.stamp_ns)
            self._ingested += 1
            for job in self.policy.on_frame(self.store, unit):
                blocks.extend(self._encode_job(job))
            self.policy.after_frame(self)
            with self._lock:
                self._enforce_caps()
            self._place_resident()
            self._ingest_ms.add(vision_ms + (time.perf_counter() - t1) * 1e3)
        self._prune_poses()
        self._stats = self._snapshot()
        return blocks

    def _prune_poses(self) -> None:
        """Forget the poses of frames neither pending nor cited by a block in memory (evicted ones).

        A received frame is pending, cited by a block or newer than every block's frames (waiting
        in a policy's state), and only leaves memory by an eviction (counted), so the table is
        scanned only after evictions: O(blocks) then, O(1) otherwise.
        """
        if not self._frame_poses or self.store.evicted_blocks == self._poses_pruned_at:
            return
        self._poses_pruned_at = self.store.evicted_blocks
        live = {(u.camera, s) for u in self.policy.pending_units() for s in (u.stamps_ns or (u.stamp_ns,))}
        newest: dict[str, int] = {}  # per camera, the newest stamp a block cites
        with self._lock:
            for b in self.store.blocks():
                live.update((b.camera, s) for s in b.stamps_ns)
                newest[b.camera] = max(newest.get(b.camera, -1), *b.stamps_ns)
        # Frames newer than any block's may wait in a policy's own state (MuKV's partial segment
        # when it keeps no frame blocks) without being pending units: kept.
        self._frame_poses = {(c, s): p for (c, s), p in self._frame_poses.items() if (c, s) in live or s > newest.get(c, -1)}

    def pending_poses(self) -> dict[tuple[str, int], Pose]:
        """Poses of frames received but cited by no block yet (an open segment, MuKV's partial one);
        snapshots keep them."""
        cited = {(b.camera, s) for b in self.store.blocks() for s in b.stamps_ns}
        return {k: p for k, p in self._frame_poses.items() if k not in cited}

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
        # Representative key for retrieval: mean of the *pre-RoPE* keys, so scores do not depend on position.
        pre_rope = self.adapter.rotate_keys(keys, -all_pos).float()  # (L, H, n, D)
        blocks, at = [], 0
        for unit, pos in zip(job.units, positions):
            t = pos.shape[1]
            sl = slice(at, at + t)
            at += t
            index = torch.arange(t)
            layers = [
                LayerKV(index=index, logical=pos, keys=keys[l, :, sl].clone(), values=values[l, :, sl].clone())
                for l in range(keys.shape[0])
            ]
            blocks.append(
                FrameBlock(
                    block_id=-(len(job.ready) + len(blocks) + 1) if provisional else self._next_block_id,
                    camera=unit.camera,
                    stamp_ns=unit.stamp_ns,
                    positions=pos,
                    key_mean=pre_rope[:, :, sl].mean(dim=2).cpu(),
                    layers=layers,
                    kind=unit.kind,
                    stream=job.stream,
                    stamps_ns=unit.stamps_ns,
                    rank=unit.rank,
                    protected=unit.protected,
                    poses=tuple(self._frame_poses.get((unit.camera, s)) for s in (unit.stamps_ns or (unit.stamp_ns,))),
                )
            )
            self._next_block_id += 0 if provisional else 1
        return list(job.ready) + blocks

    def _encode_job(self, job: EncodeJob) -> list[FrameBlock]:
        blocks = self.encode_units(job)
        with self._lock:
            for block in blocks:
                self.store.add(block)
            self.policy.after_encode(self.store, job, blocks)
            self._enforce_caps()
        return blocks

    def _place(self, per_layer, targets):
        """The cache of a plan: from the resident cache (updated in place) where the policy keeps one."""
        if self.resident is not None:
            return self.resident.cache(per_layer, targets)
        return placed_cache(self.adapter, self.store, self.sink, per_layer, targets)

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
        budget = (self.config.budget_tokens - self.sink.n_tokens) * self.adapter.geometry.n_layers - pending
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

        Policies that score memory against a text before or without the real
        pass (StreamKV's guidance prompt and layer-adaptive retrieval, HERMES'
        pseudo query, MuKV's question vector) read its queries here, in the
        context of the prompt only: the same context for every memory.
        """
        ids = self.adapter.text_ids(text)
        geo = self.adapter.geometry
        capture = QueryCapture(geo.n_q_heads, geo.n_kv_heads, geo.head_dim, keep_all=True)
        cache = placed_cache(self.adapter, self.store, self.sink, [[] for _ in range(geo.n_layers)], [[] for _ in range(geo.n_layers)])
        with capture.attached(self.adapter.query_modules()):
            self.adapter.forward(
                self.adapter.embed_tokens(ids), self.adapter.text_positions(self.sink.n_tokens, len(ids)), cache, logits=False
            )
        return torch.stack([capture.all(layer) for layer in range(geo.n_layers)])

    # --- questions --------------------------------------------------------
    def validate(self, question: Question, list_options: bool = True) -> list[int]:
        """Refuse a malformed question before any work; returns its token ids.

        ``list_options``: the options are listed in the prompt (letter scoring); False: the
        question is asked open and its options are scored as answers (likelihood scoring).
        """
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
        ids = self.adapter.question_ids(question.text, question.options if list_options else [])
        if len(ids) > self.config.max_question_tokens:
            raise RequestError(
                f"question is {len(ids)} tokens, longer than the limit of {self.config.max_question_tokens} (memory.max_question_tokens)"
            )
        return ids

    def candidates(self, question: Question) -> list[FrameBlock]:
        """Blocks of the asked cameras whose frames all lie in the asked time window (time order).

        All, not any: a block that also holds frames outside the window (a StreamKV summary
        or merged frame, a MuKV segment) would make the answer rest on them, and the
        evidence cite them, though the caller asked about the window only.
        """
        return self._candidate_set(question).blocks()

    def _candidate_set(self, question: Question) -> Candidates:
        """``candidates`` as a mask over the store's index: one vector comparison, no walk over memory."""
        mask = self.store.index.candidate_mask(question.cameras, question.since_ns, question.until_ns)
        return Candidates(self.store.index, mask)

    @staticmethod
    def _matches(question: Question, camera: str, stamps: tuple[int, ...]) -> bool:
        if question.cameras and camera not in question.cameras:
            return False
        until = question.until_ns or None
        return all(s >= question.since_ns and (until is None or s <= until) for s in stamps)

    @torch.inference_mode()
    def ask(self, question: Question, on_token=None, option_scoring: str | None = None) -> Answer:
        """Answer from memory. ``on_token(text_so_far)`` is called per generated token if given.

        A multiple-choice question is scored by ``option_scoring`` (None: the config's
        ``answer.option_scoring``): ``likelihood`` (``_ask_by_likelihood``) or ``letter`` (the
        options listed in the prompt, the letters' logits read from the prefill). Either way no
        text is generated and ``ttft_s`` is the time to the scores.
        """
        scoring = option_scoring or self.generation.answer.option_scoring
        if scoring not in OPTION_SCORINGS:
            raise RequestError(f"unknown option scoring {scoring!r}; use one of {OPTION_SCORINGS}")
        if question.options and scoring == "likelihood":
            return self._ask_by_likelihood(question, on_token)
        t0 = time.perf_counter()
        ids = self.validate(question)
        max_new = 1 if question.options else (question.max_new_tokens or self.generation.max_new_tokens)
        # Multiple choice is read from the prefill's logits: a question stage, which only changes
        # decoding, has nothing to do there, so it does not even collect attention.
        stage = self.question_stage if not question.options else None
        logits, cache, chosen, next_pos = self._prefill(question, ids, max_new, stage)
        ttft = time.perf_counter() - t0
        if question.options:
            letter_ids = self.adapter.option_token_ids(len(question.options))
            probs = torch.softmax(logits[letter_ids], dim=0)
            index = int(torch.argmax(probs))
            text, scores = question.options[index], probs.tolist()
            if on_token:
                on_token(text)
        else:
            text = self._generate(logits, cache, next_pos + len(ids), max_new, on_token)
            index, scores = -1, []
        return Answer(text, index, scores, self._evidence(chosen), ttft, time.perf_counter() - t0, self._context_len)

    def _ask_by_likelihood(self, question: Question, on_token=None) -> Answer:
        """Multiple choice by the likelihood of each option's text as the answer.

        The question is asked open (its options are not listed in the prompt) and every option
        is scored as the answer's continuation on the one cached question context
        (``_continuation_logprobs``). Options of different token lengths are made comparable by
        the **mean** log-probability per token: a sum would favour the shortest option (every
        extra token only adds a negative term), whatever the memory says. ``option_scores`` is
        the softmax of the means (sums to 1); ties go to the first option. Every option must
        also fit ``memory.max_question_tokens`` on its own, else RequestError.
        """
        t0 = time.perf_counter()
        self.validate(question, list_options=False)
        open_question = dataclasses.replace(question, options=[])
        per_token, chosen = self._continuation_logprobs(open_question, list(question.options))
        means = torch.tensor([sum(lp) / len(lp) for lp in per_token], dtype=torch.float64)
        probs = torch.softmax(means, dim=0)
        index = int(torch.argmax(probs))
        if on_token:
            on_token(question.options[index])
        total = time.perf_counter() - t0
        return Answer(question.options[index], index, probs.tolist(), self._evidence(chosen), total, total, self._context_len)

    @torch.inference_mode()
    def score_continuations(self, question: Question, continuations: list[str]) -> Continuations:
        """Summed log-probability of each continuation's tokens as the answer to the open ``question``.

        Cloze-style multiple choice: the memory is assembled and the question prefilled once
        (then the question stage, as before decoding); every continuation is scored on that
        same cache, which is cut back to it after each one, so the stream is never re-encoded
        and the continuations never see each other. ``question.options`` must be empty: the
        continuations are the options.
        """
        t0 = time.perf_counter()
        if question.options:
            raise RequestError("score_continuations takes the options as continuations; question.options must be empty")
        ttft: list[float] = []
        per_token, chosen = self._continuation_logprobs(question, continuations, lambda: ttft.append(time.perf_counter() - t0))
        return Continuations([sum(lp) for lp in per_token], self._evidence(chosen), ttft[0], time.perf_counter() - t0,
                             self._context_len, [len(lp) for lp in per_token])

    @torch.inference_mode()
    def _continuation_logprobs(self, question: Question, continuations: list[str], prefilled=None):
        """Per continuation, the log-probability (natural log) of each of its tokens as the answer
        to the open ``question``, and the blocks attended to by id.

        One context assembly and one question prefill (then the question stage, as before
        decoding); each continuation is fed token by token on that cache, cut back to it after
        each one, so the continuations never see each other. ``prefilled()`` is called once the
        question is prefilled. Refuses (RequestError) an empty continuation or one longer than
        ``memory.max_question_tokens``.
        """
        if not continuations or any(not c.strip() for c in continuations):
            raise RequestError("continuations must be non-empty strings, at least one")
        ids = self.validate(question)
        tokens = [self.adapter.text_ids(c) for c in continuations]
        for text, cont in zip(continuations, tokens):
            if len(cont) > self.config.max_question_tokens:
                raise RequestError(
                    f"option {text[:40]!r} is {len(cont)} tokens, longer than the limit of "
                    f"{self.config.max_question_tokens} (memory.max_question_tokens)"
                )
        logits, cache, chosen, next_pos = self._prefill(question, ids, max(map(len, tokens)), self.question_stage)
        if prefilled is not None:
            prefilled()
        per_token = []
        for cont in tokens:
            step_logits, pos, lps = logits, next_pos + len(ids), []
            for i, token in enumerate(cont):
                lps.append(float(torch.log_softmax(step_logits.double(), dim=0)[token]))
                if i + 1 < len(cont):  # the last token's successor is never needed
                    embeds = self.adapter.embed_tokens([token])  # (1, 1, hidden)
                    step_logits = self.adapter.forward(embeds, self.adapter.text_positions(pos, 1), cache)
                    pos += 1
            for layer in cache.layers:
                layer.crop(-(len(cont) - 1))  # back to the question's context (crop(0) is a no-op)
            per_token.append(lps)
        return per_token, chosen

    def _prefill(self, question: Question, ids: list[int], max_new: int, stage):
        """Assemble the question's context and prefill its ``ids`` on it, then run ``stage`` (if any).

        Returns (first answer token's logits, cache, blocks attended to by id, position of the first
        question token); refuses (RequestError) a question with nothing to attend to or too long a context.
        """
        candidates = self._candidate_set(question)
        # Frames a policy has not encoded into blocks yet (an open segment): the question attends to all of
        # them when they all match (the policy's cached KV, or encoded for this question), else to none.
        pending = [u for u in self.policy.pending_units() if self._matches(question, u.camera, u.stamps_ns or (u.stamp_ns,))]
        if not candidates.count and not pending:
            what = f"cameras {question.cameras}" if question.cameras else "all cameras"
            raise RequestError(f"no frames in memory for {what} in the requested time window")
        selection = self.policy.select(self.store, candidates, self.probe, question.text)
        if pending:
            if len(pending) == len(self.policy.pending_units()):
                selection.fixed = selection.fixed + self.policy.pending_blocks(self)
            else:
                selection.fixed = selection.fixed + self.encode_units(EncodeJob(pending))
        geo = self.adapter.geometry
        rows = question_span(self.adapter, question.text, question.options) if selection.query == "question" else None
        capture = QueryCapture(geo.n_q_heads, geo.n_kv_heads, geo.head_dim, rows=rows)
        cache, chosen, next_pos = self._question_cache(selection, capture)
        if next_pos + len(ids) + max_new > self.adapter.max_positions:
            raise RequestError(f"context of {next_pos + len(ids) + max_new} positions exceeds the model's {self.adapter.max_positions}")
        positions = self.adapter.text_positions(next_pos, len(ids))
        observer = stage.observer(self.sink.n_tokens, len(ids)) if stage is not None else None
        with capture.attached(self.adapter.query_modules()):
            logits = self.adapter.forward(self.adapter.embed_tokens(ids), positions, cache, observer=observer)
        self.last_logits = logits  # the first answer token's logits (parity tests, debugging)
        # Per layer, the frames attended to (evaluation's needle recall, eval/recall.py), read now:
        # a block may leave memory later, and a question-only block (an open segment) never enters it.
        self.last_layer_stamps = [
            sorted({s for bid in ids for s in chosen[bid].stamps_ns if chosen[bid].stamp_ns > 0 or chosen[bid].kind != "summary"})
            for ids in self.last_layer_blocks
        ]
        if stage is not None:
            stage.evict(cache)  # after the prefill, before decoding (TGV-KV)
        return logits, cache, chosen, next_pos

    @torch.inference_mode()
    def locate(self, query: LocateQuery) -> LocateResult:
        """The ``query.top_k`` moments most relevant to ``query.text`` (``memory/locate.py``); no text generated.

        Ranked by the policy's retrieval scores where it has them, else by one question prefill's
        attention mass. Refuses (RequestError, nothing changed) an empty query, ``top_k`` < 1, a bad
        time window, a query longer than ``memory.max_question_tokens``, or no frames to rank.
        """
        t0 = time.perf_counter()
        if query.top_k < 1:
            raise RequestError(f"top_k must be at least 1, got {query.top_k}")
        question = Question(query.text, cameras=list(query.cameras), since_ns=query.since_ns, until_ns=query.until_ns)
        ids = self.validate(question)  # empty text, window and length checks, as for a question
        candidates = self.candidates(question)
        scores = self.policy.locate_scores(candidates, self.probe, query.text)
        if scores is not None:
            blocks, values, method = candidates, scores.tolist(), "retrieval"
        else:
            mass = AttentionMass()
            _, _, chosen, _ = self._prefill(question, ids, 1, mass)
            per_block = block_masses(mass, self.last_layer_blocks, chosen, self.sink.n_tokens)
            blocks = [chosen[bid] for bid in per_block]
            values, method = list(per_block.values()), "attention"
        moments = rank_moments(blocks, values, query.top_k)
        return LocateResult(moments, method, time.perf_counter() - t0)

    @staticmethod
    def _evidence(chosen: dict[int, FrameBlock]) -> list[Evidence]:
        """The frames an answer attended to, oldest first (a summary token with no stamp cites none),
        each with the robot's pose when it was taken where the frame came with one."""
        cited: dict[tuple[int, str], Pose | None] = {}
        for b in chosen.values():
            if b.stamp_ns > 0 or b.kind != "summary":
                for s in b.stamps_ns:
                    if cited.get((s, b.camera)) is None:
                        cited[(s, b.camera)] = b.pose_at(s)
        return [Evidence(s, c, pose) for (s, c), pose in sorted(cited.items(), key=lambda kv: kv[0])]

    def _question_cache(self, selection: QuestionSelection, capture: QueryCapture):
        """The cache a question attends to, the blocks it uses (filled as layers run) and the next position.

        ``last_layer_blocks[layer]`` records the block ids each layer attended to (for tests and debugging).
        """
        n_layers = self.adapter.geometry.n_layers
        fixed = present_in(selection.fixed, n_layers)
        k = min(selection.k, selection.pool_size)
        static = selection.per_layer
        if static is None and k == selection.pool_size:  # everything fits: no scoring
            pool = selection.pool_blocks()
            static = [list(pool) for _ in range(n_layers)]
        if static is not None:
            per_layer = [
                sorted(fixed[l] + [b for b in static[l] if b.layers[l] is not None], key=lambda b: b.order)
                for l in range(n_layers)
            ]
            targets, next_pos = self.policy.layout(self.sink.n_tokens, per_layer)
            cache = self._place(per_layer, targets)
            self.last_layer_blocks = [[b.block_id for b in blocks] for blocks in per_layer]
            self._context_len = max(self.sink.n_tokens + sum(b.layer_tokens(l) for b in blocks) for l, blocks in enumerate(per_layer))
            return cache, {b.block_id: b for blocks in per_layer for b in blocks}, next_pos
        # ReKV's in-pass per-layer retrieval: every layer attends to the same number of tokens.
        if selection.pool_set is None:
            selection.pool_set = Candidates.of(self.store.index, selection.pool)
        index, pool_mask = self.store.index, selection.pool_set.mask
        sizes = index.tokens[pool_mask]  # (N, L) kept tokens, read on the index: no walk over the pool
        uniform = sizes.numel() == 0 or bool((sizes == sizes[0, 0]).all() and (index.encoded[pool_mask] == sizes[0, 0]).all())
        if not uniform or any(b.layer_tokens(l) != b.n_tokens for b in selection.fixed for l in range(n_layers)):
            raise RuntimeError("per-layer retrieval needs uncompressed, equal-size blocks")
        # The plan's layout needs only its sizes: k pool blocks of the pool's one size (any k of them).
        plan = sorted(selection.fixed + index.blocks_of(index.newest(pool_mask, k)), key=lambda b: b.order)
        _, next_pos = self.policy.layout(self.sink.n_tokens, [plan])
        n_ctx = self.sink.n_tokens + sum(b.n_tokens for b in plan)
        self._context_len = n_ctx
        chosen: dict[int, FrameBlock] = {b.block_id: b for b in selection.fixed}
        self.last_layer_blocks = [[] for _ in range(n_layers)]

        def materialize(layer: int):
            query = capture.mean(layer)  # (H, D)
            picked = index.blocks_of(index.top_k(query, layer, pool_mask, k))
            blocks = sorted(selection.fixed + picked, key=lambda b: b.order)
            chosen.update((b.block_id, b) for b in picked)
            self.last_layer_blocks[layer] = [b.block_id for b in blocks]
            targets, _ = self.policy.layout(self.sink.n_tokens, [blocks])
            return place_layer(self.adapter, self.store, self.sink, blocks, targets[0], layer)

        return RetrievingCache(n_ctx, materialize, n_layers), chosen, next_pos

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
            logits = self.adapter.forward(self.adapter.embed_tokens([token]), self.adapter.text_positions(next_pos, 1), cache)
            next_pos += 1
        return self.adapter.decode(out).strip()

    # --- lifecycle and stats ----------------------------------------------
    @torch.inference_mode()
    def _encode_sink(self) -> Sink:
        ids = self.adapter.prefix_ids()
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
        if self.resident is not None:
            self.resident.clear()
        self._frame_poses = {}
        self._ingest_ms.clear()
        self._stats = self._snapshot()

    # --- snapshots (memory/snapshot.py) -------------------------------------
    @property
    def next_block_id(self) -> int:
        """The id the next block will get (ids only increase, across snapshots too)."""
        return self._next_block_id

    @property
    def frames_ingested(self) -> int:
        return self._ingested

    def save(self, path: str | Path) -> SnapshotInfo:
        """Write the whole memory to the snapshot directory ``path`` (see ``snapshot.save_snapshot``)."""
        return save_snapshot(self, Path(path))

    def load(self, path: str | Path) -> SnapshotInfo:
        """Replace the whole memory by the snapshot at ``path``, or raise SnapshotError and change nothing."""
        return load_snapshot(self, Path(path))

    def replace_memory(
        self,
        blocks: list[FrameBlock],
        next_block_id: int,
        frames_ingested: int,
        evicted_blocks: int,
        evicted_entries: int,
        policy_meta: dict,
        policy_tensors: dict[str, torch.Tensor],
        pending_poses: dict[tuple[str, int], Pose] | None = None,
    ) -> None:
        """Replace every block, the counters and the policy's state (``snapshot.load_snapshot`` calls it).

        ``blocks`` (creation order) are built but not in any store: resident ones with their K/V
        on the device, offloaded ones with theirs staged on the host (``BlockStore.restore``).
        The policy validates its state first: a state that does not fit raises (ValueError,
        KeyError, TypeError, IndexError) with nothing changed. Then the memory is swapped and
        the current caps enforced as after an ingest: the policy's own (``after_restore``),
        then the resident budget and the host arena, the policy choosing the victims and
        every eviction counted. The pose table is rebuilt from the blocks' poses and
        ``pending_poses`` (frames cited by no block yet). Nothing there is expected to fail; should it (a bug, host
        memory exhausted), the memory is left empty rather than half restored.
        """
        by_id = {b.block_id: b for b in blocks}
        if by_id and next_block_id <= max(by_id):
            raise ValueError(f"next block id {next_block_id} is not after the last block {max(by_id)}")
        self.policy.load_state(policy_meta, policy_tensors, by_id)
        try:
            with self._lock:
                self.store.clear()
                self.store.restore(blocks, self.policy.offload_victim, evicted_blocks, evicted_entries)
                self._next_block_id, self._ingested = next_block_id, frames_ingested
                self.policy.after_restore(self.store)
                self._enforce_caps()
            self._frame_poses = dict(pending_poses or {})
            self._frame_poses.update(
                ((b.camera, s), p) for b in blocks for s, p in zip(b.stamps_ns, b.poses) if p is not None
            )
            self._poses_pruned_at = -1  # the restore may have evicted: scan once
            self._prune_poses()
        except BaseException:
            with self._lock:
                self.store.clear()
                self.policy.reset()
            self._frame_poses = {}
            raise
        finally:
            if self.resident is not None:
                self.resident.clear()
                self._place_resident()
            self._ingest_ms.clear()
            self.last_layer_blocks, self.last_layer_stamps, self._context_len, self.last_logits = [], [], 0, None
            self._stats = self._snapshot()

    def close(self) -> None:
        """Release device and host memory."""
        self.reset()
        self.store.arena = None
        self.sink = None
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
