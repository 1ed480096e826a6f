"""How options are read for multiple choice (``memory/questions/options.py``), and the engine's use of it.

- labels: dropped only when every option has the label of its place, in one style (hand-written cases);
- distinct spans: the shared leading and trailing tokens of all options left out, at least one
  token kept (hand-computed on token lists);
- the engine's likelihood scores equal a plain transformers forward's mean log-probability over
  each option's distinct tokens, computed here independently (not with the module's helpers);
- so a shared wording around the options ("a ... object", "... .") no longer decides the choice,
  and labelled options choose as their bare texts do.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.test_option_scoring import QUESTION, engine_for, reference_model, reference_token_logprobs, tiny_text  # noqa: F401
from videokv_node.memory import Question
from videokv_node.memory.questions.options import distinct_spans, option_texts

ATOL = 1e-4


@pytest.mark.parametrize("given_options, expected", [
    (["A) red", "B) blue"], ["red", "blue"]),
    (["A. Red.", "B. Green.", "C. Blue."], ["Red.", "Green.", "Blue."]),
    (["(a) left", "(b) right"], ["left", "right"]),
    (["1: one", "2: two", "3: three"], ["one", "two", "three"]),
    ([" a red object ", "a blue object"], ["a red object", "a blue object"]),  # no label, only white space
    (["a) cat", "b) dog"], ["cat", "dog"]),
])
def test_labels_of_every_option_are_dropped(given_options, expected):
    assert option_texts(given_options) == expected


@pytest.mark.parametrize("given_options", [
    ["A) red", "blue"],  # not every option labelled
    ["B) red", "A) blue"],  # labels not in their places
    ["A) red", "B. blue"],  # two styles
    ["(A) red", "B) blue"],  # enclosed and bare
    ["A) red", "b) blue"],  # cases mixed: 'b' is not the second of 'A'
    ["a cat", "b dog"],  # no separator: words, not labels
    ["1 apple", "2 apples"],
    ["A)", "B)"],  # a label with nothing after it is the option's text
])
def test_anything_less_regular_is_left_as_written(given_options):
    assert option_texts(given_options) == [o.strip() for o in given_options]


@pytest.mark.parametrize("tokens, spans", [
    ([[1], [2], [3]], [(0, 1), (0, 1), (0, 1)]),  # nothing shared
    ([[9, 1, 7], [9, 2, 7], [9, 3, 4, 7]], [(1, 2), (1, 2), (1, 3)]),  # "a X object": 9 and 7 shared
    ([[5, 8], [6, 8]], [(0, 1), (0, 1)]),  # "X.": the trailing "." shared
    ([[4, 4], [4, 4, 5]], [(1, 2), (1, 3)]),  # a prefix of another keeps its last token
    ([[3, 1], [3, 1]], [(1, 2), (1, 2)]),  # duplicates keep one token each
    ([[2, 7], [2, 7, 7]], [(1, 2), (1, 3)]),  # the shared end never eats the kept token
])
def test_distinct_spans_by_hand(tokens, spans):
    assert distinct_spans(tokens) == spans


@given(st.lists(st.lists(st.integers(0, 4), min_size=1, max_size=6), min_size=2, max_size=5))
def test_distinct_spans_keep_a_token_and_leave_out_only_what_all_share(tokens):
    spans = distinct_spans(tokens)
    starts, ends = {a for a, _ in spans}, {len(t) - b for t, (_, b) in zip(tokens, spans)}
    assert len(starts) == 1 and len(ends) == 1  # the same shared start and end for every option
    start, end = starts.pop(), ends.pop()
    assert all(b - a >= 1 for a, b in spans)
    assert all(t[:start] == tokens[0][:start] for t in tokens)
    assert all(end == 0 or t[len(t) - end:] == tokens[0][len(tokens[0]) - end:] for t in tokens)


def reference_scores(adapter, model, options: list[str]) -> list[float]:
    """Softmax of the mean plain-forward log-probability over each option's tokens that not all options
    share at their start or end (spans found here by direct comparison of the token lists)."""
    toks = [adapter.text_ids(o) for o in options]
    lps = [reference_token_logprobs(adapter, model, o) for o in options]
    start = 0
    while all(len(t) > start + 1 for t in toks) and len({t[start] for t in toks}) == 1:
        start += 1
    end = 0
    while all(len(t) - end - 1 > start for t in toks) and len({t[len(t) - end - 1] for t in toks}) == 1:
        end += 1
    means = [sum(lp[start:len(lp) - end]) / (len(lp) - end - start) for lp in lps]
    z = sum(math.exp(m) for m in means)
    return [math.exp(m) / z for m in means]


SHARED = ["the key is in the drawer.", "the key is in a box.", "the key is on the roof."]


@pytest.mark.parametrize("policy", ["full", "rekv"])
def test_likelihood_scores_only_the_distinct_tokens(tiny_text, reference_model, policy):
    engine = engine_for(tiny_text, policy=policy)
    answer = engine.ask(Question(QUESTION, options=SHARED), option_scoring="likelihood")
    expected = reference_scores(tiny_text, reference_model, SHARED)
    torch.testing.assert_close(torch.tensor(answer.option_scores, dtype=torch.float64),
                               torch.tensor(expected, dtype=torch.float64), rtol=0, atol=ATOL)
    # Precondition that makes the test able to fail: the plain mean over whole options would not give these scores.
    whole = [sum(lp) / len(lp) for lp in (reference_token_logprobs(tiny_text, reference_model, o) for o in SHARED)]
    z = sum(math.exp(m) for m in whole)
    assert max(abs(math.exp(m) / z - e) for m, e in zip(whole, expected)) > 10 * ATOL


def test_labelled_options_choose_as_their_bare_texts(tiny_text):
    engine = engine_for(tiny_text, policy="full")
    bare = ["drawer", "a box", "the roof"]
    labelled = ["A) drawer", "B) a box", "C) the roof"]
    for scoring in ("likelihood", "letter"):
        plain = engine.ask(Question(QUESTION, options=bare), option_scoring=scoring)
        got = engine.ask(Question(QUESTION, options=labelled), option_scoring=scoring)
        assert got.option_index == plain.option_index
        torch.testing.assert_close(torch.tensor(got.option_scores), torch.tensor(plain.option_scores), rtol=0, atol=1e-6)
        assert got.text == labelled[got.option_index]  # the caller's option, verbatim


def test_letter_prompt_lists_the_options_without_their_labels(tiny_text):
    engine = engine_for(tiny_text, policy="full")
    seen = []
    real = tiny_text.question_ids
    tiny_text.question_ids = lambda q, opts: seen.append(list(opts)) or real(q, opts)
    try:
        engine.ask(Question(QUESTION, options=["A. drawer", "B. roof"]), option_scoring="letter")
    finally:
        del tiny_text.question_ids
    assert ["drawer", "roof"] in seen and not any(o.startswith(("A.", "B.")) for opts in seen for o in opts)
