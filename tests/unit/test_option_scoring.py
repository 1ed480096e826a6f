"""Option scoring (``eval/option_scoring.py``) and ``VideoMemoryEngine.score_continuations``.

- cloze equals a plain transformers forward's summed log-probabilities of each option's tokens
  after [prompt, frames, open question], on every policy with budgets >= the stream;
- letter equals the engine's own ``ask`` option scores;
- scoring changes nothing: the continuations never see each other, memory is unchanged.
"""

from __future__ import annotations

import pytest
import torch

from tests.unit.test_policy_parity import BIG, UNBOUNDED
from videokv_node.eval.option_scoring import choose_option
from videokv_node.memory import GenerationConfig, MemoryConfig, Question, RequestError, VideoMemoryEngine
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
    context = list(adapter.prefix_ids())
    for i, t in enumerate(TEXTS):
        context += adapter.frame_ids(text_frame(i + 1.0, t).rgb)
    context += adapter.question_ids(QUESTION, [])
    cont = adapter.text_ids(continuation)
    ids = torch.tensor([context + cont])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)  # (N, vocab)
    # Token j of the continuation is predicted at the position just before it.
    return float(sum(logp[len(context) - 1 + j, tok] for j, tok in enumerate(cont)))


@pytest.mark.parametrize("name", sorted(UNBOUNDED))
def test_cloze_equals_a_plain_forward(tiny_text, reference_model, name):
    engine = engine_for(tiny_text, **UNBOUNDED[name])
    choice = choose_option(engine, QUESTION, OPTIONS, "cloze")
    ref = [reference_logprob(tiny_text, reference_model, o) for o in OPTIONS]
    torch.testing.assert_close(torch.tensor(choice.scores, dtype=torch.float64), torch.tensor(ref, dtype=torch.float64), rtol=0, atol=ATOL)
    assert choice.index == max(range(len(ref)), key=ref.__getitem__)
    assert choice.method == "cloze"
    assert choice.evidence_stamps_ns == [round((i + 1) * 1e9) for i in range(len(TEXTS))]


def test_letter_equals_the_engines_option_scores(tiny_text):
    engine = engine_for(tiny_text, policy="rekv", retrieve_frames=BIG)
    choice = choose_option(engine, QUESTION, OPTIONS, "letter")
    answer = engine.ask(Question(QUESTION, options=OPTIONS))
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
