"""How the engine answers: questions (open, multiple choice) and continuations, from memory.

``Answerer`` sits on the question reader (``question_reader.py``: the checks, the policy's selection, the one
prefill pass); what the last question attended to is the reader's record. The flow:

    question -> candidates (camera / time filter) -> policy.select -> Static | InPass (context/selection.py)
             -> the question's cache (context/question_cache.py) -> one prefill pass, each layer attending to its own blocks
             -> question stage (TGV-KV eviction) -> answer (letters' logits, options' likelihoods, or greedy decoding)
"""

from __future__ import annotations

import dataclasses
import time

import torch

from videokv_node.memory.config import OPTION_SCORINGS, ConfigError, check_choice
from videokv_node.memory.context.attended import evidence_of
from videokv_node.memory.question import Answer, Continuations, Question, RequestError
from videokv_node.memory.questions.options import distinct_spans, option_texts, span_means
from videokv_node.memory.questions.question_reader import QuestionReader
from videokv_node.memory.records.clock import elapsed_s
from videokv_node.memory.records.engine_settings import EngineSettings


class Answerer:
    """Questions and continuations answered from memory (the engine's thread only): the reader's prefill,
    then the options' scores, the continuations' log-probabilities or greedy decoding. Durations wait for
    the device (``records/clock.py``); a refused question (``RequestError``) changes nothing."""

    def __init__(self, reader: QuestionReader, question_stage, settings: EngineSettings) -> None:
        self.reader, self.runner, self.adapter, self.settings = reader, reader.runner, reader.adapter, settings
        self.question_stage = question_stage  # TGV-KV's eviction before decoding, or None (context/question_stage.py)

    @torch.inference_mode()
    def ask(self, question: Question, on_token=None, option_scoring: str | None = None) -> Answer:
        """Answer from memory. ``on_token(text_so_far)`` is called per generated token if given.

        A multiple-choice question is scored by ``option_scoring`` (None: the config's
        ``answer.option_scoring``): ``likelihood`` (``_ask_by_likelihood``) or ``letter`` (the
        options listed in the prompt, the letters' logits read from the prefill). Either way no
        text is generated and ``ttft_s`` is the time to the scores.
        """
        scoring = option_scoring or self.settings.generation.answer.option_scoring
        try:
            check_choice("option_scoring", scoring, OPTION_SCORINGS)  # one check, one message: config_base.check_choice
        except ConfigError as exc:
            raise RequestError(f"unknown option scoring: {exc}") from None
        if question.options and scoring == "likelihood":
            return self._ask_by_likelihood(question, on_token)
        t0 = time.perf_counter()
        asked, question = question, dataclasses.replace(question, options=option_texts(question.options))  # labels dropped
        ids = self.reader.validate(question)
        max_new = 1 if question.options else (question.max_new_tokens or self.settings.generation.max_new_tokens)
        # Multiple choice is read from the prefill's logits: a question stage, which only changes
        # decoding, has nothing to do there, so it does not even collect attention.
        stage = self.question_stage if not question.options else None
        logits, cache, chosen, next_pos = self.reader.prefill(question, ids, max_new, stage)
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
        return Answer(text, index, scores, evidence_of(chosen), ttft, time.perf_counter() - t0, self.reader.context_len)

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
        self.reader.validate(question, list_options=False)
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
        return Answer(question.options[index], index, probs.tolist(), evidence_of(chosen), total, total, self.reader.context_len)

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
                             self.reader.context_len, [len(lp) for lp in per_token])

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
        ids = self.reader.validate(question)
        tokens = [self.adapter.text_ids(c) for c in continuations]
        for text, cont in zip(continuations, tokens):
            if len(cont) > self.settings.memory.max_question_tokens:
                raise RequestError(
                    f"option {text[:40]!r} is {len(cont)} tokens, longer than the limit of "
                    f"{self.settings.memory.max_question_tokens} (memory.max_question_tokens)"
                )
        logits, cache, chosen, next_pos = self.reader.prefill(question, ids, max(map(len, tokens)), self.question_stage)
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
                fed = self.runner.feed_text(cont[:-1], next_pos + len(ids), cache, n_logits=n)
                rows = torch.cat([rows, fed.view(n, -1)])
                for layer in cache.layers:
                    layer.crop(-n)  # back to the question's context
            log_probs = torch.log_softmax(rows.double(), dim=-1)
            per_token.append(log_probs[torch.arange(len(cont)), torch.tensor(cont)].tolist())
        return per_token, chosen

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
            logits = self.runner.feed_text([token], next_pos, cache)
            next_pos += 1
        return self.adapter.decode(out).strip()
