"""Reading a question over memory: the checks, the candidates, the policy's selection and the one prefill pass.

``QuestionReader`` is the question side's reading step, shared by answering (``answering.py``) and
``~/locate`` (``locate.py``): it refuses a malformed question before any work, filters the candidates by camera
and time window, asks the policy what the question attends to (``MemoryPolicy.select``: Static | InPass,
``context/selection.py``), builds that cache (``context/question_cache.py``) and prefills the question on it,
then runs the question stage (TGV-KV eviction) if one is given. It records what the last question attended to
(``last_layer_blocks``, ``last_layer_token_share``, ``last_logits``, ``context_len``) for evaluation and
debugging. What memory holds is left as it was (a question may bring StreamKV's cached open segment up to
date, as an ingest would).
"""

from __future__ import annotations

import torch

from videokv_node.memory.context.attended import attended_frames
from videokv_node.memory.context.encoding import EncodeJob
from videokv_node.memory.context.model_runner import ModelRunner
from videokv_node.memory.context.question_cache import question_context
from videokv_node.memory.context.question_span import question_span
from videokv_node.memory.context.retrieval_cache import QueryCapture
from videokv_node.memory.context.selection import InPass
from videokv_node.memory.policies.base import MemoryPolicy, PolicyHost
from videokv_node.memory.question import Question, RequestError
from videokv_node.memory.records.engine_settings import EngineSettings
from videokv_node.memory.store.block import FrameBlock
from videokv_node.memory.store.block_index import Candidates
from videokv_node.memory.store.block_store import BlockStore


class QuestionReader:
    """Checks, candidates and the prefill of a question (the engine's thread only).

    Guarantees: a refused question (``RequestError``) has changed nothing; ``prefill`` reads memory and
    leaves it as it was; ``last_*`` describe the last prefill (cleared by ``clear_last``)."""

    def __init__(self, runner: ModelRunner, store: BlockStore, policy: MemoryPolicy, host: PolicyHost,
                 settings: EngineSettings) -> None:
        self.runner, self.adapter, self.store, self.policy, self.host, self.settings = runner, runner.adapter, store, policy, host, settings
        self.clear_last()

    def clear_last(self) -> None:
        """Forget what the last question attended to (a restored memory)."""
        self.last_layer_blocks: list[list[int]] = []  # per layer, block ids the last question attended to
        self.last_layer_token_share: list[dict[int, float]] = []  # per layer, {stamp: share of its tokens attended}
        self.context_len = 0  # largest per-layer context (sink included) of the last question
        self.last_logits: torch.Tensor | None = None  # the first answer token's logits (parity tests, debugging)

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
        generation, memory = self.settings.generation, self.settings.memory
        if question.max_new_tokens > generation.max_new_tokens_limit:
            raise RequestError(f"max_new_tokens {question.max_new_tokens} exceeds the limit {generation.max_new_tokens_limit}")
        ids = self.adapter.question_ids(question.text, question.options if list_options else [])
        if len(ids) > memory.max_question_tokens:
            raise RequestError(f"question is {len(ids)} tokens, longer than the limit of "
                               f"{memory.max_question_tokens} (memory.max_question_tokens)")
        return ids

    def candidates(self, question: Question) -> list[FrameBlock]:
        """Blocks of the asked cameras whose frames all lie in the asked time window (time order).

        All, not any: a block that also holds frames outside the window (a StreamKV summary
        or merged frame, a MuKV segment) would make the answer rest on them, and the
        evidence cite them, though the caller asked about the window only.
        """
        return self.candidate_set(question).blocks()

    def candidate_set(self, question: Question) -> Candidates:
        """``candidates`` as a mask over the store's index: one vector comparison, no walk over memory."""
        mask = self.store.index.candidate_mask(question.cameras, question.since_ns, question.until_ns)
        return Candidates(self.store.index, mask)

    @staticmethod
    def matches(question: Question, camera: str, stamps: tuple[int, ...]) -> bool:
        """Whether a frame of ``camera`` at ``stamps`` lies in the question's cameras and window."""
        if question.cameras and camera not in question.cameras:
            return False
        until = question.until_ns or None
        return all(s >= question.since_ns and (until is None or s <= until) for s in stamps)

    def prefill(self, question: Question, ids: list[int], max_new: int, stage):
        """Assemble the question's context and prefill its ``ids`` on it, then run ``stage`` (if any).

        Returns (first answer token's logits, cache, blocks attended to by id, position of the first
        question token); refuses (RequestError) a question with nothing to attend to or too long a context.
        """
        adapter, policy, sink = self.adapter, self.policy, self.runner.sink
        candidates = self.candidate_set(question)
        # Frames a policy has not encoded into blocks yet (an open segment): the question attends to all of
        # them when they all match (the policy's cached KV, or encoded for this question), else to none.
        segment = policy.open_segment()
        waiting = segment.units() if segment is not None else []
        pending = [u for u in waiting if self.matches(question, u.camera, u.stamps_ns or (u.stamp_ns,))]
        if not candidates.count and not pending:
            what = f"cameras {question.cameras}" if question.cameras else "all cameras"
            raise RequestError(f"no frames in memory for {what} in the requested time window")
        selection = policy.select(self.host, candidates, question.text)  # Static | InPass (context/selection.py)
        if pending and segment is not None:  # attended in every layer (pending frames are the segment's)
            every = len(pending) == len(waiting)
            selection = selection.plus(segment.blocks(self.host) if every else self.runner.encode_units(EncodeJob(pending)))
        geo = adapter.geometry
        own = isinstance(selection, InPass) and selection.query == "question"  # ReKV's mean over the question's own rows
        capture = QueryCapture(geo.n_q_heads, geo.n_kv_heads, geo.head_dim,
                               rows=question_span(adapter, question.text, question.options) if own else None)
        context = question_context(selection, adapter, self.store, sink, policy.layout, self.runner.place, capture)
        # Per layer, the block ids attended to (an in-pass retrieval fills them as the layers run), for tests and debugging.
        self.last_layer_blocks, self.context_len = context.layer_blocks, context.context_len
        cache, chosen, next_pos = context.cache, context.chosen, context.next_pos
        if next_pos + len(ids) + max_new > adapter.max_positions:
            raise RequestError(f"context of {next_pos + len(ids) + max_new} positions exceeds the model's {adapter.max_positions}")
        observer = stage.observer(sink.n_tokens, len(ids)) if stage is not None else None
        with capture.attached(adapter.query_modules()):
            logits = self.runner.feed_text(ids, next_pos, cache, observer=observer)
        self.last_logits = logits
        # Per layer, the frames attended to and their kept shares (needle recall, eval/recall.py), read now.
        self.last_layer_token_share = attended_frames(self.last_layer_blocks, chosen)
        if stage is not None:
            stage.evict(cache)  # after the prefill, before decoding (TGV-KV)
        return logits, cache, chosen, next_pos
