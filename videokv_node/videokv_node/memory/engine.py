"""The video memory engine: frames in, bounded KV memory held, questions answered from it.

One thread owns an engine (the node's model worker); ``stats()`` may be read from any thread. The flow, ReKV's:

    frame -> still-frame test -> vision tower -> policy.on_frame -> encode jobs
          -> decoder over [sink + policy.encoding_context] -> blocks -> policy.after_encode (compression)
          -> BlockStore -> caps enforced (the oldest of each tier leaves)
    question -> candidates (camera / time filter) -> policy.select -> Static | InPass
             -> one prefill pass, each layer attending to its own blocks
             -> question stage (TGV-KV eviction) -> answer

The engine composes collaborators with one job each (as nano-vllm's ``LLMEngine`` holds a scheduler, a model
runner and a block manager) and keeps only construction, run-time configuration and the stats here:

- ``ModelRunner`` (``context/model_runner.py``): the one object that runs the model for the memory: the sink,
  encoding, probes, re-reads, HERMES' pseudo-queries. The policy reaches it through ``PolicyHost`` only.
- ``IngestPipeline`` (``frames/ingest_pipeline.py``): still frames (``frames/still.py``), the decoder, the
  policy's steps and the caps (``frames/caps.py``); the vision stage is ``frames/vision_stage.py``.
- ``QuestionReader``, ``Answerer``, ``Locator`` (``questions/``): a question's checks, selection and prefill;
  its answer; ``~/locate``.
- ``EngineState`` (``snapshot/engine_state.py``) and ``FrameTables`` (``store/frame_tables.py``): the state out
  and in, and the poses and words of frames.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

import torch

from videokv_node.memory.config import ConfigError, GenerationConfig, MemoryConfig
from videokv_node.memory.records.model_fit import fit_to_model
from videokv_node.memory.context.encoding import EncodeJob
from videokv_node.memory.context.model_runner import ModelRunner
from videokv_node.memory.context.question_stage import make_question_stage
from videokv_node.memory.context.resident_cache import ResidentCache
from videokv_node.memory.context.retrieval_cache import Sink
from videokv_node.memory.frames.ingest_pipeline import IngestPipeline
from videokv_node.memory.frames.vision_stage import PreparedFrames, start_vision
from videokv_node.memory.policies.factory import make_policy
from videokv_node.memory.policies.host import EngineHost
from videokv_node.memory.question import Answer, Continuations, Frame, Question
from videokv_node.memory.questions.answering import Answerer
from videokv_node.memory.questions.locate import LocateQuery, LocateResult, Locator
from videokv_node.memory.questions.question_reader import QuestionReader
from videokv_node.memory.records.engine_settings import EngineSettings
from videokv_node.memory.snapshot.engine_state import EngineState
from videokv_node.memory.stats import EngineStats
from videokv_node.memory.store.block import FrameBlock
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.memory.store.frame_tables import FrameTables
from videokv_node.models.adapter import VideoLLMAdapter


class VideoMemoryEngine:
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
        self.settings = EngineSettings(memory, generation)  # read by every collaborator; changed here only
        self.policy = make_policy(memory, adapter)
        self.question_stage = make_question_stage(memory)
        offload = memory.offload_bytes if self.policy.uses_offload else 0
        self.store = BlockStore(adapter.geometry, adapter.device, offload, memory.page_tokens)
        self.tables = FrameTables()
        self.runner = ModelRunner(adapter, self.store, self.policy, self.tables)
        self.check_budget(memory)
        # full and hermes attend to the resident tier as it is: kept placed between steps (memory/context/resident_cache.py).
        if self.policy.resident_context:
            self.runner.resident = ResidentCache(adapter, self.store, self.runner.sink, memory.budget_tokens)
        self._lock = threading.Lock()  # guards the store against ``stats()`` readers
        runner = self.runner
        # What the policy may ask of the engine (memory/policies/host.py): never the engine itself.
        self.host = EngineHost(self.store, runner.sink, runner.new_block_id, runner.encode_units, runner.probe,
                               self.read_alone, runner.pseudo_attention, runner.placed_keys)
        self.pipeline = IngestPipeline(runner, self.store, self.policy, self.host, self.tables, self.settings, self._lock)
        self.reader = QuestionReader(runner, self.store, self.policy, self.host, self.settings)
        self.answerer = Answerer(self.reader, self.question_stage, self.settings)
        self.locator = Locator(self.reader, self.policy, self.host, self.store, self.settings)
        self.state = EngineState(runner, self.store, self.policy, self.tables, self.pipeline, self.reader, self._refresh_stats)
        self.policy.setup(self.host)
        self._stats = self._snapshot()

    # --- the configs: shared with the collaborators through ``settings``
    @property
    def config(self) -> MemoryConfig:
        return self.settings.memory

    @config.setter
    def config(self, memory: MemoryConfig) -> None:
        self.settings.memory = memory

    @property
    def generation(self) -> GenerationConfig:
        return self.settings.generation

    @generation.setter
    def generation(self, generation: GenerationConfig) -> None:
        self.settings.generation = generation

    @property
    def sink(self) -> Sink | None:
        """The prompt sink's K/V (``ModelRunner.sink``); None once closed."""
        return self.runner.held_sink

    @property
    def resident(self) -> ResidentCache | None:
        return self.runner.resident

    # --- run-time configuration: the fields of MemoryConfig that may change while the stream runs (the rest
    # shapes the policy, the host arena, the question stage or the still filter, built once at start).
    RUNTIME_FIELDS = ("budget_tokens", "max_question_tokens", "retrieve_frames")

    def check_budget(self, memory: MemoryConfig) -> None:
        """Raise ConfigError unless ``memory.budget_tokens`` holds the prompt sink, the local window
        and one frame, and meets the policy's own rule (HERMES: a chunk); reads only, any thread."""
        sink = self.runner.sink.n_tokens  # RuntimeError once closed
        need = sink + memory.local_window_tokens + self.adapter.tokens_per_frame
        # What the store may hold per layer (HERMES' script rule: its budget + a chunk, the sink apart).
        if self.policy.resident_tokens(memory.budget_tokens, sink) < need - sink:
            raise ConfigError(
                f"memory.budget_tokens ({memory.budget_tokens}) must hold the prompt sink ({sink}), "
                f"the local window ({memory.local_window_tokens}) and one frame ({self.adapter.tokens_per_frame}): >= {need}"
            )
        self.policy.check_budget(memory.budget_tokens, sink)

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
            self.pipeline.enforce_caps_locked()
        self.runner.place_resident()
        if generation is not None:
            self.generation = generation
        self._stats = self._snapshot()

    # --- ingest (``IngestPipeline``) ---------------------------------------------
    def ingest(self, frames: list[Frame], between: Callable[[], None] | None = None) -> list[FrameBlock]:
        """Encode frames (time order) into memory; returns the blocks made (some may be evicted already).

        A policy that encodes segments may make no block for a frame yet (it waits in the open segment).
        Where the policy allows (``batch_window``), up to ``memory.prefill_batch`` frames are prefilled in
        one pass, each exactly as alone (``context/batch_prefill.py``); the policy's steps, the caps and
        the stats then follow frame by frame, in order. ``between()`` runs after each such chunk but the
        last, the memory complete up to its last frame: a waiting read-only request need not wait for all."""
        return self.ingest_prepared(self.prepare(frames), between)

    def prepare(self, frames: list[Frame], vision: Callable[[Callable], Future] | None = None) -> PreparedFrames:
        """Ingest's first stage: still frames merged (``memory.redundancy``: they extend stored frames' spans
        now), the vision encoder over the rest run now, or submitted through ``vision`` (``vision_thread().submit``)."""
        kept = self.pipeline.merge_still(frames)
        if frames and not kept:  # all merged: nothing more comes for them
            self._stats = self._snapshot()
        return start_vision(self.adapter, kept, vision)

    def ingest_prepared(self, prepared: PreparedFrames, between: Callable[[], None] | None = None) -> list[FrameBlock]:
        """The rest of ``ingest`` after ``prepare`` (``frames/vision_stage.py``): the decoder, the policy, the caps."""
        blocks = self.pipeline.ingest(prepared, between)
        if prepared.frames:
            self._stats = self._snapshot()
        return blocks

    def encode_units(self, job: EncodeJob, provisional: bool = False) -> list[FrameBlock]:
        """``ModelRunner.encode_units``: a job's blocks, encoded after the policy's context, not stored."""
        return self.runner.encode_units(job, provisional)

    def new_block_id(self) -> int:
        """An id for a block a policy creates itself (HERMES' summary token)."""
        return self.runner.new_block_id()

    def probe(self, text: str) -> torch.Tensor:
        """(L, n, H_q, D) pre-RoPE queries of ``text`` read right after the prompt sink (``ModelRunner.probe``)."""
        return self.runner.probe(text)

    # --- questions (``QuestionReader``, ``Answerer``, ``Locator``) ------------------
    def validate(self, question: Question, list_options: bool = True) -> list[int]:
        """Refuse a malformed question before any work; returns its token ids (``QuestionReader.validate``)."""
        return self.reader.validate(question, list_options)

    def candidates(self, question: Question) -> list[FrameBlock]:
        """Blocks of the asked cameras whose frames all lie in the asked window, time order (``QuestionReader``)."""
        return self.reader.candidates(question)

    def ask(self, question: Question, on_token=None, option_scoring: str | None = None) -> Answer:
        """Answer from memory (``Answerer.ask``). ``on_token(text_so_far)`` is called per generated token if given."""
        return self.answerer.ask(question, on_token, option_scoring)

    def score_continuations(self, question: Question, continuations: list[str]) -> Continuations:
        """Summed log-probability of each continuation as the answer to the open ``question`` (``Answerer``)."""
        return self.answerer.score_continuations(question, continuations)

    def locate(self, query: LocateQuery) -> LocateResult:
        """The ``query.top_k`` moments most relevant to ``query.text`` (``questions/locate.py``), re-read by
        ``read_alone``."""
        return self.locator.locate(query, self.read_alone)

    def read_alone(self, blocks: Sequence[FrameBlock], text: str) -> list[float]:
        """``PolicyHost.read_alone``: per block, the mean log-probability per token of ``text``'s subject as the
        answer to ``answer.locate_prompt`` about that block alone (``ModelRunner.read_alone``)."""
        return self.runner.read_alone(blocks, self.generation.answer.locate_prompt, text)

    @property
    def last_layer_blocks(self) -> list[list[int]]:
        """Per layer, block ids the last question attended to."""
        return self.reader.last_layer_blocks

    @property
    def last_layer_token_share(self) -> list[dict[int, float]]:
        """Per layer, {stamp: share of its tokens attended} of the last question."""
        return self.reader.last_layer_token_share

    @property
    def last_layer_stamps(self) -> list[list[int]]:
        """Per layer, the stamps of the frames the last question attended to (from ``last_layer_token_share``)."""
        return [sorted(shares) for shares in self.reader.last_layer_token_share]

    @property
    def last_logits(self) -> torch.Tensor | None:
        """The last question's first answer token's logits (parity tests, debugging)."""
        return self.reader.last_logits

    # --- state (``EngineState``) -------------------------------------------------
    @property
    def next_block_id(self) -> int:
        """The id the next block will get (ids only increase, across restarts too)."""
        return self.runner.next_block_id

    @property
    def frames_ingested(self) -> int:
        return self.pipeline.ingested

    @property
    def still(self):
        """The still-frame filter (``frames/still.py``), or None where ``memory.redundancy`` is off."""
        return self.pipeline.still

    def pending_poses(self) -> dict:
        """Poses of frames received but cited by no block yet (``FrameTables.pending_poses``)."""
        return self.tables.pending_poses(self.store)

    def pending_words(self) -> dict:
        """Words of frames received but cited by no block yet (``FrameTables.pending_words``)."""
        return self.tables.pending_words(self.store)

    def identity(self) -> dict:
        """What a saved state must match to be loaded here (``EngineState.identity``)."""
        return self.state.identity()

    def state_dict(self, kv_for=None) -> dict:
        """The whole memory, tensors by reference (``EngineState.state_dict``)."""
        return self.state.state_dict(kv_for)

    def load_state_dict(self, state: dict) -> None:
        """Replace the memory by ``state``'s, checked before anything changes (``EngineState.load_state_dict``)."""
        self.state.load_state_dict(state)

    # --- lifecycle and stats ----------------------------------------------
    def reset(self) -> None:
        """Forget every frame; the sink and the lifetime counters stay."""
        with self._lock:
            self.store.clear()
            self.policy.reset()
            self.pipeline.reset()
        if self.resident is not None:
            self.resident.clear()
        self.tables.clear()
        self._stats = self._snapshot()

    def close(self) -> None:
        """Release device and host memory."""
        self.reset()
        self.store.arena = None
        self.runner.release_sink()
        self.host.held_sink = None  # the policy's view of it too
        self.runner.resident = None
        if self.adapter.device.type == "cuda":
            torch.cuda.empty_cache()

    def stats(self) -> EngineStats:
        """The latest snapshot (updated after each ingest and reset); never blocks on the model."""
        return self._stats

    def _refresh_stats(self) -> None:
        self._stats = self._snapshot()

    def _snapshot(self) -> EngineStats:
        """O(1) in what memory holds: every figure is a counter the store keeps (issue 16)."""
        with self._lock:
            sink = self.sink.n_tokens if self.sink is not None else 0
            n_layers = self.adapter.geometry.n_layers
            resident_entries = self.store.resident_entries + sink * n_layers
            arena = self.store.arena
            oldest, newest = self.store.stamp_range()
            still, segment = self.pipeline.still, self.policy.open_segment()
            return EngineStats(
                policy=self.policy.name,
                frames_ingested=self.pipeline.ingested,
                frames_merged=0 if still is None else still.frames_merged,
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
                ingest_ms_p50=self.pipeline.ingest_ms.percentile(50),
                ingest_ms_p95=self.pipeline.ingest_ms.percentile(95),
                streamkv_open_segment_bytes=0 if segment is None else segment.feature_bytes() + self.store.entry_bytes(segment.entries()),
            )
