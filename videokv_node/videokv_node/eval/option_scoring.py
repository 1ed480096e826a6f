"""Three ways to pick a multiple-choice option from memory, reported side by side.

- ``letter``: the options are listed in the prompt as "A. ...", and the option whose letter
  has the largest logit as the first answer token wins (``VideoMemoryEngine.ask`` with
  ``option_scoring="letter"``). Scores: softmax over the letters.
- ``likelihood``: the node's default (``answer.option_scoring``): the question is asked open
  and each option's text is scored as the answer by its **mean** log-probability per token,
  all options on one cached question context (``VideoMemoryEngine.ask`` with
  ``option_scoring="likelihood"``). Scores: softmax of the means.
- ``cloze``: as ``likelihood`` but by the **sum** of the option's log-probabilities
  (``VideoMemoryEngine.score_continuations``), which favours short options; kept because
  the earlier accuracy tables were measured with it. Scores: the summed log-probabilities.
  Why several: a 135M model barely follows the "answer with the letter" instruction (near
  chance, issue 6), yet the likelihood of the right text still shows what it remembers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from videokv_node.memory.config import OPTION_SCORINGS
from videokv_node.memory.engine import VideoMemoryEngine
from videokv_node.memory.question import Question

METHODS = (*OPTION_SCORINGS, "cloze")  # the node's scorings (memory/config.py) and the eval's own


@dataclass(frozen=True, slots=True)
class OptionChoice:
    index: int  # the chosen option
    scores: list[float]  # per option: probability (letter, likelihood) or summed log-probability (cloze)
    method: str  # letter, likelihood or cloze
    ttft_s: float  # question start -> the first scores available (letter: all of them)
    total_s: float  # question start -> every option scored
    evidence_stamps_ns: list[int]  # frames the scoring attended to, oldest first
    n_context_tokens: int  # tokens attended to in the largest layer, sink included


def choose_option(engine: VideoMemoryEngine, question: str | Question, choices: list[str], method: str) -> OptionChoice:
    """Score ``choices`` for ``question`` from the engine's memory, without changing the memory.

    ``question`` may be a ``Question`` (its cameras and time window are kept; its options are
    replaced by ``choices``). Raises ValueError for an unknown method, RequestError as the
    engine does for a question it refuses.
    """
    base = question if isinstance(question, Question) else Question(question)
    if method in OPTION_SCORINGS:
        answer = engine.ask(_with_options(base, list(choices)), option_scoring=method)
        return OptionChoice(answer.option_index, answer.option_scores, method, answer.ttft_s, answer.total_s,
                            [e.stamp_ns for e in answer.evidence], answer.n_context_tokens)
    if method == "cloze":
        result = engine.score_continuations(_with_options(base, []), list(choices))
        index = int(torch.argmax(torch.tensor(result.logprobs)))  # ties: the first option
        return OptionChoice(index, result.logprobs, method, result.ttft_s, result.total_s,
                            [e.stamp_ns for e in result.evidence], result.n_context_tokens)
    raise ValueError(f"unknown option scoring method {method!r}; use one of {METHODS}")


def _with_options(q: Question, options: list[str]) -> Question:
    return Question(q.text, options=options, cameras=list(q.cameras), since_ns=q.since_ns, until_ns=q.until_ns,
                    max_new_tokens=q.max_new_tokens)
