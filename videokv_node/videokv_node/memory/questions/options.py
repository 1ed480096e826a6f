"""How the options of a multiple-choice question are read: their labels, and the tokens that tell them apart.

A planner sends options as it words them: ``["red", "green"]``, ``["A) Red.", "B) Green."]``,
``["a red object", "a green object"]``. The answer must not depend on that wording, only on
what the memory holds. Two rules make it so (docs/POLICIES.md, "Scoring continuations"):

1. **Labels are not part of the answer** (``option_texts``). When *every* option starts with
   the label of its own place in the list, in one style (``A)``, ``(a)``, ``1.``, ``B:``, ...:
   letters from A or a, or numbers from 1, each followed by ``)``, ``.`` or ``:`` and a space, or
   enclosed in parentheses), the labels are dropped before scoring and before the options are
   listed in a letter prompt (which adds its own letters). Surrounding white space is dropped
   too. Anything less regular is left as it is: ``["a cat", "a dog"]`` has no label.
   The answer's text is still the caller's option, verbatim.
2. **Only the tokens that differ are compared** (``distinct_spans``). Under likelihood scoring an
   option's score is the mean log-probability of its tokens as the answer. Tokens that *every*
   option shares at its start have the same probability in every option (same context, same
   tokens), so they only dilute the means, by more for the shorter options; tokens every
   option shares at its end ("." or " object") are scored after different words and measure
   the fluency of the phrase, not what memory holds. Both are left out of the mean: each
   option is scored by the mean over its span of distinct tokens, conditioned on the shared
   start as the model reads it. At least one token of every option is kept, so an option
   that is all shared (a duplicate, or a prefix of another) still has a score.

Measured (docs/bench/options.md#videokv-tiny-multiple-choice-as-a-planner-words-it-option-wording;
``tinyvlm/option_wording.py``): on videokv-tiny's
answers about objects drawn by another renderer, shape was chosen right 11 of 24 times from
``"a circle object"``-style options and 16 of 24 from ``"A) circle"`` before these rules, 24 and 23
of 24 after them, as from the bare words (23 of 24).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# A leading label: "A) ", "A. ", "A: ", "(A) ", "1) ", ... (group "paren": the enclosed form).
_LABEL = re.compile(r"^\s*(?:\((?P<paren>[A-Za-z]|\d{1,2})\)|(?P<bare>[A-Za-z]|\d{1,2})[\).:])\s+(?=\S)")


def _expected_labels(style: str, n: int) -> list[str]:
    if style.isdigit():
        return [str(i + 1) for i in range(n)]
    first = "A" if style.isupper() else "a"
    return [chr(ord(first) + i) for i in range(n)]


def option_texts(options: Sequence[str]) -> list[str]:
    """The options as they are scored and listed: their labels dropped where every option has the
    label of its place in one style (rule 1 above), and surrounding white space dropped."""
    matches = [m for o in options if (m := _LABEL.match(o)) is not None]
    if len(options) >= 2 and len(matches) == len(options):  # every option labelled
        labels = [m.group("paren") or m.group("bare") for m in matches]
        forms = {m.group("paren") is not None for m in matches}
        separators = {m.group(0).strip()[-1] for m in matches}  # one style: ")" "." or ":" throughout
        if len(forms) == 1 and len(separators) == 1 and labels == _expected_labels(labels[0], len(labels)):
            return [o[m.end():].strip() for o, m in zip(options, matches)]
    return [o.strip() for o in options]


def _common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    n = 0
    for column in zip(*seqs):
        if any(t != column[0] for t in column):
            break
        n += 1
    return n


def distinct_spans(tokens: Sequence[Sequence[int]]) -> list[tuple[int, int]]:
    """Per option, the ``(start, end)`` token span that is scored (rule 2 above): the tokens every
    option shares at its start (before ``start``) and at its end (from ``end``) left out, at least
    one token of each option kept. Every option must have at least one token."""
    if any(len(t) == 0 for t in tokens):
        raise ValueError("every option needs at least one token")
    shortest = min(len(t) for t in tokens)
    start = min(_common_prefix(tokens), shortest - 1)
    rests = [list(t[start:]) for t in tokens]
    suffix = min(_common_prefix([r[::-1] for r in rests]), shortest - start - 1)
    return [(start, len(t) - suffix) for t in tokens]


def span_means(per_token: Sequence[Sequence[float]], spans: Sequence[tuple[int, int]]) -> list[float]:
    """Each option's mean log-probability over its scored span (``distinct_spans``): the likelihood score."""
    return [sum(lp[a:b]) / (b - a) for lp, (a, b) in zip(per_token, spans)]
