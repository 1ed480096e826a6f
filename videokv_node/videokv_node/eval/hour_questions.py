"""A planner's questions about an hour stream (``eval/hour_stream.py``), with their truth by construction.

Asked at three moments: halfway and at three quarters (``ask_after`` = that frame; only about what
was seen by then: colour, shape and, at three quarters, one order question) and after the last
frame (every kind). Kinds (``KINDS``):

- ``colour``: "Which colour did the <shape> have?" (4 colours; chance 1/4);
- ``shape``: "What shape was the <colour> thing?" (3 shapes; 1/3);
- ``order``: "Which did you see first, X or Y?" (2 options; 1/2), by first appearance;
- ``after``: "What did you see right after X?" (the next thing shown after X's first appearance and 3
  other coloured shapes; 1/4);
- ``count``: "How many times did you see X?" (once, twice, three times, four times; 1/4), X shown 1-3 times.

And per thing seen, a ``~/locate`` query ("the red circle") whose truth is its appearances; "when
did you last see X" is the latest of them (``LocateTruth``). A real thing's (``real_things``) is its glimpse and
any shot of the footage over the same photograph.

The wordings are past tense and name things as a planner would; videokv-tiny's training asks in
the present about one picture (tinyvlm/variety.py ``WORDINGS``), so none of these is a training
wording (tests/unit/test_hour_stream.py checks). Each question carries its evidence as groups of
frames (``evidence``): one group per appearance it rests on; a memory has what it needs when each
group has at least one frame attended (a thing shown in 3 consecutive frames is seen in any of them).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from videokv_node.eval.hour_stream import Appearance, HourStream
from videokv_node.tinyvlm.scenes import COLOURS, SHAPES

KINDS = ("colour", "shape", "order", "after", "count")
COUNT_WORDS = ("once", "twice", "three times", "four times")


@dataclass(frozen=True, slots=True)
class HourQuestion:
    question: str
    choices: tuple[str, ...]
    answer: int  # index of the right choice
    kind: str  # one of KINDS
    ask_after: int  # asked once frames 0..ask_after are in memory
    evidence: tuple[tuple[int, ...], ...]  # per appearance it rests on, its frame indices
    subject: str = ""  # what ~/locate would be asked for ("the red circle"); "" for order questions


@dataclass(frozen=True, slots=True)
class LocateTruth:
    """A ``~/locate`` query and where the thing was: every appearance's frames, the last one's last frame."""

    query: str
    ask_after: int
    appearances: tuple[tuple[int, ...], ...]

    @property
    def last_frame(self) -> int:
        return self.appearances[-1][-1]


def _mc(rng: np.random.Generator, text: str, answer: str, pool: list[str], kind: str, ask_after: int,
        evidence: list[Appearance], subject: str = "", n: int = 4) -> HourQuestion:
    others = [p for p in pool if p != answer]
    others = [others[i] for i in rng.permutation(len(others))[:n - 1]]
    choices = [answer, *others]
    choices = [choices[i] for i in rng.permutation(len(choices))]
    return HourQuestion(text, tuple(choices), choices.index(answer), kind, ask_after,
                        tuple(a.frames for a in evidence), subject)


def _questions_at(stream: HourStream, ask_after: int, rng: np.random.Generator, full: bool,
                  orders: int = 2) -> list[HourQuestion]:
    """The questions about what was seen in frames 0..ask_after; ``full``: every kind, else only the
    single-thing kinds and ``orders`` order questions."""
    before = ask_after + 1
    seen = [t for t in range(len(stream.things)) if stream.appearances_of(t, before)]
    out = []
    for t in seen:
        thing, apps = stream.things[t], stream.appearances_of(t, before)
        last = apps[-1:]  # the latest showing is enough to tell its colour or shape
        out.append(_mc(rng, f"Which colour did the {thing.shape} have?", thing.colour, list(COLOURS), "colour",
                       ask_after, last, thing.subject))
        out.append(_mc(rng, f"What shape was the {thing.colour} thing?", thing.shape, list(SHAPES), "shape",
                       ask_after, last, thing.subject))
    firsts = [(stream.appearances_of(t, before)[0], t) for t in seen]  # (first appearance, thing)
    firsts.sort(key=lambda p: p[0].frames[0])
    names = [stream.things[t].name for t in range(len(stream.things))]
    pairs = [(i, j) for i in range(len(firsts)) for j in range(i + 1, len(firsts))]
    for p in rng.choice(len(pairs), min(orders, len(pairs)), replace=False) if pairs else ():  # on distinct pairs
        i, j = pairs[int(p)]
        (ai, ti), (aj, tj) = firsts[i], firsts[j]
        pair = [names[ti], names[tj]]
        flip = bool(rng.random() < 0.5)
        x, y = (pair[1], pair[0]) if flip else (pair[0], pair[1])
        out.append(HourQuestion(f"Which did you see first, the {x} or the {y}?", (x, y), 1 if flip else 0, "order",
                                ask_after, (ai.frames, aj.frames)))
    if not full:
        return out
    order = [a for a in stream.appearances if a.frames[-1] < before]
    k = int(rng.integers(len(firsts) - 1))
    first_x, tx = firsts[k]
    nxt = next(a for a in order if a.frames[0] > first_x.frames[-1] and a.thing != tx)
    every = [f"{c} {s}" for c in COLOURS for s in SHAPES]  # the stream's others and shapes never shown
    out.append(_mc(rng, f"What did you see right after the {names[tx]}?", names[nxt.thing],
                   [n for n in every if n != names[tx]], "after", ask_after, [first_x, nxt],
                   stream.things[tx].subject))
    counted = max(seen, key=lambda t: (len(stream.appearances_of(t, before)), -t))
    if rng.random() < 0.5:  # sometimes a thing seen once, so 'once' is an answer too
        counted = min(seen, key=lambda t: (len(stream.appearances_of(t, before)), t))
    apps = stream.appearances_of(counted, before)
    out.append(_mc(rng, f"How many times did you see the {names[counted]}?", COUNT_WORDS[len(apps) - 1],
                   list(COUNT_WORDS), "count", ask_after, apps, stream.things[counted].subject))
    return out


def hour_questions(stream: HourStream, seed: int = 0) -> list[HourQuestion]:
    """Halfway and three-quarter questions (single-thing kinds, one order question at three quarters, about
    what was seen by then), then the end's (every kind); in asking order."""
    rng = np.random.default_rng([stream.seed, seed, 1])
    n = stream.n_frames
    return (_questions_at(stream, n // 2 - 1, rng, full=False, orders=0)
            + _questions_at(stream, 3 * n // 4 - 1, rng, full=False, orders=1)
            + _questions_at(stream, n - 1, rng, full=True))


def locate_truths(stream: HourStream) -> list[LocateTruth]:
    """One ``~/locate`` query per thing, asked after the last frame: the shapes', then the real things' (if any).
    A real thing's truth is its glimpse and every shot over the same photograph (the footage may pan over a
    held-out photograph too: a frame of that pan shows the thing as well as the glimpse does)."""
    shapes = [LocateTruth(thing.subject, stream.n_frames - 1, tuple(a.frames for a in stream.appearances_of(t)))
              for t, thing in enumerate(stream.things)]
    real = []
    for t, thing in enumerate(stream.real_things):
        photo = thing.source.partition(":")[2]
        shown = [a.frames for a in stream.real_appearances if a.thing == t]
        shown += [tuple(range(s.start, s.start + s.length)) for s in stream.shots
                  if s.source == photo and s.source in stream.library.photos]
        real.append(LocateTruth(thing.subject, stream.n_frames - 1, tuple(sorted(shown))))
    return shapes + real
