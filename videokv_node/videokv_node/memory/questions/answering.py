"""How the engine answers: questions (open, multiple choice), continuations and locate, from memory.

A mixin of ``VideoMemoryEngine`` (as transformers' ``GenerationMixin`` is of its models): it reads
the engine's adapter, store, sink, policy and question stage, leaves what memory holds as it was
(a question may bring StreamKV's cached open segment up to date, as an ingest would), and records
what the last question attended to (``last_layer_blocks``, ``last_layer_token_share``,
``last_logits``) for evaluation and debugging; durations wait for the device (``clock.py``). The flow:

    question -> candidates (camera / time filter) -> policy.select -> Static | InPass (context/selection.py)
             -> the question's cache (context/question_cache.py) -> one prefill pass, each layer attending to its own blocks
             -> question stage (TGV-KV eviction) -> answer
"""

from __future__ import annotations

import dataclasses
import time

import torch

from videokv_node.memory.context.attended import attended_frames, evidence_of
from videokv_node.memory.store.block import FrameBlock
from videokv_node.memory.store.block_index import Candidates
from videokv_node.memory.records.clock import elapsed_s
from videokv_node.memory.config import OPTION_SCORINGS, ConfigError, check_choice
from videokv_node.memory.context.encoding import EncodeJob
from videokv_node.memory.questions.locate import (AttentionMass, LocateQuery, LocateResult, block_masses, likelihood_scores, rank_moments,
                                        rerank_by_likelihood, subject_of, with_named)
from videokv_node.memory.store.words import words_shortlist
from videokv_node.memory.questions.options import distinct_spans, option_texts, span_means
from videokv_node.memory.context.selection import InPass
from videokv_node.memory.question import Answer, Continuations, Question, RequestError
from videokv_node.memory.context.question_cache import question_context
from videokv_node.memory.context.question_span import question_span
from videokv_node.memory.context.retrieval_cache import QueryCapture


class AnsweringMixin:
    """Questions, continuations and locate for ``VideoMemoryEngine`` (the engine's thread only)."""

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
            raise RequestError(f"question is {len(ids)} tokens, longer than the limit of "
                               f"{self.config.max_question_tokens} (memory.max_question_tokens)")
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
        try:
            check_choice("option_scoring", scoring, OPTION_SCORINGS)  # one check, one message: config_base.check_choice
        except ConfigError as exc:
            raise RequestError(f"unknown option scoring: {exc}") from None
        if question.options and scoring == "likelihood":
            return self._ask_by_likelihood(question, on_token)
        t0 = time.perf_counter()
        asked, question = question, dataclasses.replace(question, options=option_texts(question.options))  # labels dropped
        ids = self.validate(question)
        max_new = 1 if question.options else (question.max_new_tokens or self.generation.max_new_tokens)
        # Multiple choice is read from the prefill's logits: a question stage, which only changes
        # decoding, has nothing to do there, so it does not even collect attention.
        stage = self.question_stage if not question.options else None
        logits, cache, chosen, next_pos = self._prefill(question, ids, max_new, stage)
        ttft = elapsed_s(t0, self.adapter.device)
        if question.options:
            letter_ids = self.adapter.option_token_ids(len(question.options))
            probs = torch.softmax(logits[letter_ids], dim=0)
            index = int(torch.argmax(probs))
            text, scores = asked.options[index], probs.tolist()
            if on_token:
                on_token(text)
        else:
            text = self._generate(logits, cache, next_pos + len(ids), max_new, on_token)
            index, scores = -1, []
        return Answer(text, index, scores, evidence_of(chosen), ttft, time.perf_counter() - t0, self._context_len)

    def _ask_by_likelihood(self, question: Question, on_token=None) -> Answer:
        """Multiple choice by the likelihood of each option's text as the answer.

        The question is asked open (its options are not listed in the prompt) and every option
        is scored as the answer's continuation on the one cached question context
        (``_continuation_logprobs``). Options of different token lengths are made comparable by
        the **mean** log-probability per token: a sum would favour the shortest option (every
        extra token only adds a negative term), whatever the memory says. The mean is taken over
        the tokens that tell the options apart (``memory/questions/options.py``: labels such as "A)" dropped,
        tokens every option shares at its start or end left out). ``option_scores`` is the
        softmax of the means (sums to 1); ties go to the first option. Every option must also
        fit ``memory.max_question_tokens`` on its own, else RequestError.
        """
        t0 = time.perf_counter()
        self.validate(question, list_options=False)
        open_question = dataclasses.replace(question, options=[])
        texts = option_texts(question.options)
        spans = distinct_spans([self.adapter.text_ids(t) for t in texts])
        per_token, chosen = self._continuation_logprobs(open_question, texts, ends=[end for _, end in spans])
        means = torch.tensor(span_means(per_token, spans), dtype=torch.float64)
        probs = torch.softmax(means, dim=0)
        index = int(torch.argmax(probs))
        if on_token:
            on_token(question.options[index])
        total = time.perf_counter() - t0
        return Answer(question.options[index], index, probs.tolist(), evidence_of(chosen), total, total, self._context_len)

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
        per_token, chosen = self._continuation_logprobs(question, continuations, lambda: ttft.append(elapsed_s(t0, self.adapter.device)))
        return Continuations([sum(lp) for lp in per_token], evidence_of(chosen), ttft[0], time.perf_counter() - t0,
                             self._context_len, [len(lp) for lp in per_token])

    @torch.inference_mode()
    def _continuation_logprobs(self, question: Question, continuations: list[str], prefilled=None, ends=None):
        """Per continuation, the log-probability (natural log) of each of its tokens as the answer
        to the open ``question``, and the blocks attended to by id.

        One context assembly and one question prefill (then the question stage, as before
        decoding); each continuation is fed in one causal pass on that cache (its tokens see each
        other as they would fed one by one), cut back to it after each one, so the continuations
        never see each other. ``prefilled()`` is called once the
        question is prefilled. ``ends``: per continuation, score only its first ``ends[i]`` tokens
        (the rest is never fed). Refuses (RequestError) an empty continuation or one longer than
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
        for k, cont in enumerate(tokens):
            cont = cont[: ends[k]] if ends is not None else cont
            # Row i predicts token i: the question's last logits, then one causal pass over the
            # continuation less its last token (whose successor is never needed): one decoder pass for
            # any length, not one per token (on a GPU each pass is ~20 ms of launches whatever its length).
            rows = logits[None]
            if len(cont) > 1:
                n = len(cont) - 1
                positions = self.adapter.text_positions(next_pos + len(ids), n)
                fed = self.adapter.forward(self.adapter.embed_tokens(cont[:-1]), positions, cache, n_logits=n)
                rows = torch.cat([rows, fed.view(n, -1)])
                for layer in cache.layers:
                    layer.crop(-n)  # back to the question's context
            log_probs = torch.log_softmax(rows.double(), dim=-1)
            per_token.append(log_probs[torch.arange(len(cont)), torch.tensor(cont)].tolist())
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
        selection = self.policy.select(self.host, candidates, question.text)  # Static | InPass (context/selection.py)
        if pending:  # attended in every layer
            every = len(pending) == len(self.policy.pending_units())
            selection = selection.plus(self.policy.pending_blocks(self.host) if every else self.encode_units(EncodeJob(pending)))
        geo = self.adapter.geometry
        own = isinstance(selection, InPass) and selection.query == "question"  # ReKV's mean over the question's own rows
        capture = QueryCapture(geo.n_q_heads, geo.n_kv_heads, geo.head_dim,
                               rows=question_span(self.adapter, question.text, question.options) if own else None)
        context = question_context(selection, self.adapter, self.store, self.sink, self.policy.layout, self._place, capture)
        # Per layer, the block ids attended to (an in-pass retrieval fills them as the layers run), for tests and debugging.
        self.last_layer_blocks, self._context_len = context.layer_blocks, context.context_len
        cache, chosen, next_pos = context.cache, context.chosen, context.next_pos
        if next_pos + len(ids) + max_new > self.adapter.max_positions:
            raise RequestError(f"context of {next_pos + len(ids) + max_new} positions exceeds the model's {self.adapter.max_positions}")
        positions = self.adapter.text_positions(next_pos, len(ids))
        observer = stage.observer(self.sink.n_tokens, len(ids)) if stage is not None else None
        with capture.attached(self.adapter.query_modules()):
            logits = self.adapter.forward(self.adapter.embed_tokens(ids), positions, cache, observer=observer)
        self.last_logits = logits  # the first answer token's logits (parity tests, debugging)
        # Per layer, the frames attended to and their kept shares (needle recall, eval/recall.py), read now.
        self.last_layer_token_share = attended_frames(self.last_layer_blocks, chosen)
        if stage is not None:
            stage.evict(cache)  # after the prefill, before decoding (TGV-KV)
        return logits, cache, chosen, next_pos

    @torch.inference_mode()
    def locate(self, query: LocateQuery) -> LocateResult:
        """The ``query.top_k`` moments most relevant to ``query.text`` (``memory/questions/locate.py``), no text generated:
        the policy's retrieval scores, else one question prefill's attention mass; then (``answer.locate_rerank``
        > 0) the best, and the blocks whose words name the query's thing, re-ranked by the query's likelihood about
        each alone. Refuses (RequestError, nothing changed) an empty query, top_k < 1, a bad window, too long a query, or no frames to rank."""
        t0, answer = time.perf_counter(), self.generation.answer
        if query.top_k < 1:
            raise RequestError(f"top_k must be at least 1, got {query.top_k}")
        question = Question(query.text, cameras=list(query.cameras), since_ns=query.since_ns, until_ns=query.until_ns)
        ids = self.validate(question)  # empty text, window and length checks, as for a question
        candidates = self.candidates(question)
        scores = self.policy.locate_scores(candidates, self.probe, query.text)
        if scores is not None:
            blocks, values, method = candidates, scores.tolist(), "retrieval"
        else:
            _, _, chosen, _ = self._prefill(question, ids, 1, mass := AttentionMass())
            per_block = block_masses(mass, self.last_layer_blocks, chosen, self.sink.n_tokens)
            blocks, values, method = [chosen[bid] for bid in per_block], list(per_block.values()), "attention"
        shortlist = max(query.top_k, answer.locate_rerank)
        moments = rank_moments(blocks, values, shortlist, sources := {})
        if answer.locate_rerank:  # each shortlisted moment's block read alone (memory/questions/locate.py)
            subject = subject_of(query.text)
            ids = self.store.words.named(subject) if answer.locate_words else {}  # the store's word index
            if ids and (named := words_shortlist([b for b in candidates if b.block_id in ids], subject, shortlist)):
                moments, method = with_named(moments, sources, named), method + "+words"  # blocks whose words name the thing
            moments = rerank_by_likelihood(moments, sources, lambda bs: self.read_alone(bs, query.text), query.top_k)
            method += "+likelihood"
        return LocateResult(moments, method, elapsed_s(t0, self.adapter.device))

    @property
    def last_layer_stamps(self) -> list[list[int]]:
        """Per layer, the stamps of the frames the last question attended to (from ``last_layer_token_share``)."""
        return [sorted(shares) for shares in self.last_layer_token_share]

    def read_alone(self, blocks: list[FrameBlock], text: str) -> list[float]:
        """``PolicyHost.read_alone``: per block, the mean log-probability per token of ``text``'s subject as the
        answer to ``answer.locate_prompt`` about that block alone (memory/questions/locate.py ``likelihood_scores``)."""
        return likelihood_scores(self.adapter, self.store, self.sink, self.policy, blocks, self.generation.answer.locate_prompt, text)

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
