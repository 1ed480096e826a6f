"""Option scoring (``eval/option_scoring.py``) and ``VideoMemoryEngine.score_continuations``.

- cloze equals a plain transformers forward's summed log-probabilities of each option's tokens
  after [prompt, frames, open question], on every policy with budgets >= the stream;
- likelihood (the node's default) equals the softmax of a plain forward's mean log-probability
  per option token, and picks by the mean where the sum would pick the shortest option;
- letter equals the engine's own ``ask`` option scores;
- scoring changes nothing: the continuations never see each other, memory is unchanged.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.unit.test_policy_parity import BIG, UNBOUNDED
from videokv_node.eval.option_scoring import choose_option
from videokv_node.memory import GenerationConfig, MemoryConfig, Question, RequestError, VideoMemoryEngine
from videokv_node.memory.config import AnswerConfig, ConfigError
from videokv_node.models.text_lm import TextLMAdapter, text_frame, tiny_text_model

ATOL = 1e-4
TEXTS = ["the cup is red", "a door opens", "the key is in the drawer", "rain outside"]
OPTIONS = ["drawer", "a box", "the roof"]
QUESTION = "where is the key?"


@pytest.fixture(scope="module")
def tiny_text():
    return TextLMAdapter.tiny(seed=0)


@pytest.fixture(scope="module")
def reference_model():
    model, _ = tiny_text_model(seed=0)
    model.config._attn_implementation = "sdpa"
    return model


def engine_for(adapter, **kw) -> VideoMemoryEngine:
    cfg = dict(budget_tokens=BIG, local_window_tokens=BIG // 2, offload_bytes=1 << 22)
    cfg.update(kw)
    engine = VideoMemoryEngine(adapter, MemoryConfig(**cfg), GenerationConfig(max_new_tokens=4))
    for i, t in enumerate(TEXTS):
        engine.ingest([text_frame(i + 1.0, t)])
    return engine


def reference_logprob(adapter, model, continuation: str) -> float:
    """Summed log p(option tokens | prompt, frames, open question) from one plain forward."""
    return sum(reference_token_logprobs(adapter, model, continuation))


def reference_token_logprobs(adapter, model, continuation: str) -> list[float]:
    """log p of each option token given [prompt, frames, open question, the option's earlier tokens]."""
    context = list(adapter.prefix_ids())
    for i, t in enumerate(TEXTS):
        context += adapter.frame_ids(text_frame(i + 1.0, t).rgb)
    context += adapter.question_ids(QUESTION, [])
    cont = adapter.text_ids(continuation)
    ids = torch.tensor([context + cont])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)  # (N, vocab)
    # Token j of the continuation is predicted at the position just before it.
    return [float(logp[len(context) - 1 + j, tok]) for j, tok in enumerate(cont)]


@pytest.mark.parametrize("name", sorted(UNBOUNDED))
def test_cloze_equals_a_plain_forward(tiny_text, reference_model, name):
    engine = engine_for(tiny_text, **UNBOUNDED[name])
    choice = choose_option(engine, QUESTION, OPTIONS, "cloze")
    ref = [reference_logprob(tiny_text, reference_model, o) for o in OPTIONS]
    torch.testing.assert_close(torch.tensor(choice.scores, dtype=torch.float64), torch.tensor(ref, dtype=torch.float64), rtol=0, atol=ATOL)
    assert choice.index == max(range(len(ref)), key=ref.__getitem__)
    assert choice.method == "cloze"
    assert choice.evidence_stamps_ns == [round((i + 1) * 1e9) for i in range(len(TEXTS))]


@pytest.mark.parametrize("name", sorted(UNBOUNDED))
def test_likelihood_is_the_softmax_of_mean_token_logprobs(tiny_text, reference_model, name):
    engine = engine_for(tiny_text, **UNBOUNDED[name])
    answer = engine.ask(Question(QUESTION, options=OPTIONS))  # answer.option_scoring defaults to likelihood
    means = []
    for o in OPTIONS:
        lps = reference_token_logprobs(tiny_text, reference_model, o)
        means.append(sum(lps) / len(lps))
    expected = [math.exp(m) / sum(math.exp(x) for x in means) for m in means]
    torch.testing.assert_close(torch.tensor(answer.option_scores, dtype=torch.float64),
                               torch.tensor(expected, dtype=torch.float64), rtol=0, atol=ATOL)
    assert answer.option_index == max(range(len(means)), key=means.__getitem__)
    assert answer.text == OPTIONS[answer.option_index]
    assert answer.ttft_s == answer.total_s  # multiple choice: the time to the scores
    assert [e.stamp_ns for e in answer.evidence] == [round((i + 1) * 1e9) for i in range(len(TEXTS))]


# On the tiny text model (seed 0) these options' summed log-probabilities rank the shortest,
# "red" (3 tokens), first; per token, "a box" is the likeliest. The precondition is checked below
# against a plain forward, so the test cannot pass by accident if the model changes.
LENGTH_OPTIONS = ["in the drawer by the door", "red", "a box"]


def test_likelihood_compares_options_per_token_not_by_sum(tiny_text, reference_model):
    per_token = [reference_token_logprobs(tiny_text, reference_model, o) for o in LENGTH_OPTIONS]
    by_sum = max(range(3), key=lambda i: sum(per_token[i]))
    by_mean = max(range(3), key=lambda i: sum(per_token[i]) / len(per_token[i]))
    assert (LENGTH_OPTIONS[by_sum], LENGTH_OPTIONS[by_mean]) == ("red", "a box")  # precondition
    engine = engine_for(tiny_text, policy="full")
    assert engine.ask(Question(QUESTION, options=LENGTH_OPTIONS)).option_index == by_mean
    assert engine.ask(Question(QUESTION, options=LENGTH_OPTIONS), option_scoring="likelihood").text == "a box"
    assert choose_option(engine, QUESTION, LENGTH_OPTIONS, "cloze").index == by_sum


def test_option_scoring_follows_the_config_and_the_call(tiny_text):
    engine = engine_for(tiny_text, policy="full")
    letter = engine.ask(Question(QUESTION, options=OPTIONS), option_scoring="letter")
    engine.reconfigure(engine.config, GenerationConfig(max_new_tokens=4, answer=AnswerConfig(option_scoring="letter")))
    assert engine.ask(Question(QUESTION, options=OPTIONS)).option_scores == letter.option_scores
    likelihood = engine.ask(Question(QUESTION, options=OPTIONS), option_scoring="likelihood")
    assert likelihood.option_scores != letter.option_scores
    with pytest.raises(RequestError, match="unknown option scoring"):
        engine.ask(Question(QUESTION, options=OPTIONS), option_scoring="vote")
    with pytest.raises(ConfigError, match="answer.option_scoring"):
        AnswerConfig(option_scoring="vote")


def test_an_option_longer_than_the_question_limit_is_refused(tiny_text):
    engine = engine_for(tiny_text, policy="full", max_question_tokens=40)
    before = engine.stats()
    long_option = "x" * 41  # the tiny text tokenizer: one token per character
    with pytest.raises(RequestError, match="option 'xxx.*41 tokens.*memory.max_question_tokens"):
        engine.ask(Question("where?", options=["drawer", long_option]))
    with pytest.raises(RequestError, match="options must not contain empty strings"):
        engine.ask(Question(QUESTION, options=["drawer", " "]))
    with pytest.raises(RequestError, match="at least 2 options"):
        engine.ask(Question(QUESTION, options=["drawer"]))
    assert engine.stats() == before


def test_letter_equals_the_engines_option_scores(tiny_text):
    engine = engine_for(tiny_text, policy="rekv", retrieve_frames=BIG)
    choice = choose_option(engine, QUESTION, OPTIONS, "letter")
    answer = engine.ask(Question(QUESTION, options=OPTIONS), option_scoring="letter")
    assert choice.scores == answer.option_scores
    assert choice.index == answer.option_index
    assert abs(sum(choice.scores) - 1.0) < 1e-6


def test_continuations_never_see_each_other_and_memory_is_unchanged(tiny_text):
    engine = engine_for(tiny_text, policy="full")
    before = engine.stats()
    forward = engine.score_continuations(Question(QUESTION), OPTIONS).logprobs
    backward = engine.score_continuations(Question(QUESTION), OPTIONS[::-1]).logprobs
    assert forward == pytest.approx(backward[::-1], abs=1e-9)
    assert engine.stats() == before


def test_bad_requests_are_refused(tiny_text):
    engine = engine_for(tiny_text, policy="full")
    with pytest.raises(RequestError, match="question.options must be empty"):
        engine.score_continuations(Question(QUESTION, options=["a", "b"]), OPTIONS)
    with pytest.raises(RequestError, match="non-empty"):
        engine.score_continuations(Question(QUESTION), ["a", " "])
    with pytest.raises(ValueError, match="unknown option scoring method"):
        choose_option(engine, QUESTION, OPTIONS, "vote")
