"""Questions over contexts the size a memory hands the decoder: ``videokv-tiny`` v6's long examples (issue 43).

v5 trained on 1 to 4 frames; a question of the node reads 8 to 64 frames (a window and retrieved frames),
and at the hour its ceiling answered 37% (chance ~32%). Here each example is ``frames`` frames of real footage
(``tinyvlm/drawn.py``'s frames with nothing drawn, in runs of one source as a camera's shots) with two or three
coloured shapes shown among them as the hour shows its needles (``eval/hour_stream.py``: distinct colours and
shapes; two shown once and one two or three times, each showing 1 to 3 consecutive frames, at least one other
frame between showings), and one question of the hour's kinds (``eval/hour_questions.py``): a shape's colour, a
colour's shape, which came first, what came right after, how many times. The trainer lays the frames out with the
engine's position gaps (``ProjectorTrainer``'s ``max_gap``).

Two options (off by default, so the runs recorded before them draw the same examples), for contexts laid out as
the hour's ceiling and a memory's retrieval lay them out (issue 43, v6-run8: in every val ceiling question the
thing asked about touches another thing's frames): ``touching_share`` of the contexts put the showings back to back
(two showings of one thing still apart, by another thing's frames or one background frame, so a count stays
defined; the other background frames before and after them), and ``glimpse_share`` of them also show 1 to 3 glimpses of a real photograph
(``glimpses``: crops of training photographs, as the hour glimpses held-out ones), 1 to 3 frames each, never
asked about and never an answer. Simplified against the hour: a glimpse repeats one crop, where the hour's shows
views of its photograph a little apart.

A third option, ``where_share`` (issue 43: the README's bag asks "Where is the yellow triangle?" and v6.3 answered
"middle" for both such questions; on 60 single val frames it said "middle" 44 times, 36 of them rightly: a large
thing's centre often lies in the middle third): that share of the examples asks where a thing was in the view
(``WHERE``: left, middle, right, the third of the frame holding its centre, as the bag's signs and v5's columns are
placed) over a shot with one frame of the thing shown 1 to 8 times in a row (a sign a camera passes stays where it is;
simplified: the same frame repeated, where a moving camera's frames differ around it). Measured (v6-run13, 0.2 at half of run10's rates; v6-run14, 0.4 at
run10's): neither moved val's answers off "middle" (docs/notes/2026-11-29-issue43-head-backdrops.md); off by default.

Wordings: ``WORDINGS``, none of them the hour's (``eval/hour_questions.py`` asks in words training never uses,
tests/unit/test_hour_examples.py checks). Answers are the option texts the node's likelihood scoring compares
("red", "triangle", "the red circle" is asked as "red circle", "twice"); a ``letter_share`` of them is asked as
letter multiple choice, as v5's fixed-answer kinds are.
"""

from __future__ import annotations

import numpy as np

from videokv_node.tinyvlm.drawn import DrawnFrame
from videokv_node.tinyvlm.scenes import COLOURS, SHAPES, Example
from videokv_node.tinyvlm.variety import with_letter_options

KINDS = ("hour colour", "hour shape", "hour order", "hour after", "hour count")
WHERE_KIND = "hour where"  # not in KINDS: drawn by ``where_share``, not by the kinds' weights
WHERE = ("left", "middle", "right")  # as eval/robot_bag.PLACES and v5's columns
COUNT_WORDS = ("once", "twice", "three times", "four times")  # as eval/hour_questions.COUNT_WORDS
WORDINGS = {
    "hour colour": ("What colour was the {shape}?", "Which colour was the {shape} you saw?",
                    "The {shape} you saw: what colour was it?", "Tell me the colour of the {shape}.",
                    "What was the colour of the {shape}?"),
    "hour shape": ("Which shape was the {colour} thing?", "What was the shape of the {colour} thing you saw?",
                   "The {colour} thing: what shape was it?", "Name the shape of the {colour} thing.",
                   "What shape did the {colour} thing have?"),
    "hour order": ("Which came first, the {x} or the {y}?", "Did you see the {x} or the {y} earlier?",
                   "Which of the {x} and the {y} did you see earlier?", "What showed up first: the {x} or the {y}?"),
    "hour after": ("What came right after the {x}?", "Which thing did you see next after the {x}?",
                   "After the {x}, what did you see next?", "What was the next thing you saw after the {x}?"),
    WHERE_KIND: ("Where was the {x}?", "Which side of the view was the {x} on?", "In which part of the picture was the {x}?",
                 "Where in the view did you see the {x}?"),
    "hour count": ("How often did you see the {x}?", "How many times was the {x} in view?",
                   "Count the times you saw the {x}.", "How many separate times did you spot the {x}?"),
}
NAMES = tuple(f"{c} {s}" for c in COLOURS for s in SHAPES)


class HourExampleSampler:
    """Long examples from pools of encoded frames: ``needles[name]`` frames showing only that thing, ``shots`` runs of
    frames showing nothing (a run is one source, as a shot)."""

    def __init__(self, seed: int, needles: dict[str, list[DrawnFrame]], shots: list[list[DrawnFrame]],
                 frames: tuple[int, int] = (8, 48), letter_share: float = 0.3,
                 kind_weights: dict[str, float] | None = None, touching_share: float = 0.0,
                 glimpses: list | None = None, glimpse_share: float = 0.0, where_share: float = 0.0):
        """``kind_weights``: a kind's weight in the draw of each example's kind (the kinds a context allows; missing
        kinds weigh 1); None: every allowed kind alike (issue 43 run3 weighs colour and shape up: the kinds the
        decoder read worst)."""
        missing = [n for n in NAMES if not needles.get(n)]
        if missing:
            raise ValueError(f"no needle frames for {missing}")
        self.rng = np.random.default_rng([seed, 4343])
        self.needles, self.shots = needles, [s for s in shots if s]
        self.frames, self.letter_share = frames, letter_share
        unknown = set(kind_weights or {}) - set(KINDS)
        if unknown or any(w <= 0 for w in (kind_weights or {}).values()):
            raise ValueError(f"kind weights must be positive and name kinds of {KINDS}: {kind_weights}")
        self.kind_weights = kind_weights
        if not (0 <= touching_share <= 1 and 0 <= glimpse_share <= 1) or (glimpse_share > 0 and not glimpses):
            raise ValueError(f"touching_share and glimpse_share are shares in [0, 1], glimpse_share needs glimpses: "
                             f"{touching_share}, {glimpse_share}, {len(glimpses or ())} glimpses")
        self.touching_share, self.glimpses, self.glimpse_share = touching_share, list(glimpses or ()), glimpse_share
        if not 0 <= where_share <= 1:
            raise ValueError(f"where_share is a share in [0, 1]: {where_share}")
        self.where_share = where_share

    def _background(self, n: int) -> list[DrawnFrame]:
        out: list[DrawnFrame] = []
        while len(out) < n:
            shot = self.shots[int(self.rng.integers(len(self.shots)))]
            out += shot[: int(self.rng.integers(1, len(shot) + 1))]
        return out[:n]

    def context(self) -> tuple[list[DrawnFrame], list[tuple[str, int, int]]]:
        """Frames and the showings as (thing name, first frame, last frame), in time order."""
        rng = self.rng
        n = int(rng.integers(self.frames[0], self.frames[1] + 1))
        k = 3 if rng.random() < 0.7 else 2
        colours = [str(c) for c in rng.permutation(list(COLOURS))[:k]]
        shapes = [str(s) for s in rng.permutation(list(SHAPES))[:k]]
        names = [f"{c} {s}" for c, s in zip(colours, shapes)]
        counts = [1] * k
        counts[int(rng.integers(k))] = int(rng.integers(1, 4))
        order = [t for t, c in enumerate(counts) for _ in range(c)]
        order = [order[i] for i in rng.permutation(len(order))]
        touching = self.touching_share > 0 and rng.random() < self.touching_share
        if self.glimpse_share > 0 and rng.random() < self.glimpse_share:
            for _ in range(int(rng.integers(1, 4))):  # -1: a glimpse of a photograph, nobody's showing
                order.insert(int(rng.integers(len(order) + 1)), -1)
        lengths = [int(rng.integers(1, 4)) for _ in order]
        # background frames a showing needs before it: 1 after any other (v6-run1..7); touching, 1 only after a
        # showing of the same thing
        need = [0] + [0 if touching and (t != u or t < 0) else 1 for u, t in zip(order, order[1:])]
        n = max(n, sum(lengths) + sum(need))
        spare = n - sum(lengths) - sum(need)
        if touching:  # the background before and after the showings, none between
            ends = rng.multinomial(spare, [0.5, 0.5]).tolist()
            gaps = [ends[0]] + need[1:] + [ends[1]]
        else:
            gaps = rng.multinomial(spare, np.full(len(order) + 1, 1 / (len(order) + 1))).tolist()
            gaps = [g + (need[i] if i < len(order) else 0) for i, g in enumerate(gaps)]
        background = self._background(sum(gaps))
        frames, showings, b = [], [], 0
        for i, (t, length) in enumerate(zip(order, lengths)):
            frames += background[b : b + gaps[i]]
            b += gaps[i]
            first = len(frames)
            if t < 0:
                glimpse = self.glimpses[int(rng.integers(len(self.glimpses)))]
                frames += [glimpse] * length
                continue
            pool = self.needles[names[t]]
            frames += [pool[int(rng.integers(len(pool)))] for _ in range(length)]
            showings.append((names[t], first, len(frames) - 1))
        frames += background[b:]
        return frames, showings

    def where_example(self) -> Example:
        """"Where was the <thing>?" over a shot: one frame of a thing (one thing drawn) shown 1 to 8 times in a row at a
        random place among background frames, the answer the third of the frame holding the thing's centre."""
        rng = self.rng
        name = NAMES[int(rng.integers(len(NAMES)))]
        pool = self.needles[name]
        needle = pool[int(rng.integers(len(pool)))]
        length = int(rng.integers(1, 9))
        n = max(int(rng.integers(self.frames[0], self.frames[1] + 1)), length + 1)
        background = self._background(n - length)
        at = int(rng.integers(len(background) + 1))
        frames = background[:at] + [needle] * length + background[at:]
        words = WORDINGS[WHERE_KIND]
        q = words[int(rng.integers(len(words)))].format(x=name)
        ex = Example(tuple(frames), q, WHERE[min(2, int(needle.things[0].x * 3))], WHERE_KIND)
        if rng.random() < self.letter_share:
            ex = with_letter_options(ex, WHERE, rng, n=len(WHERE))
        return ex

    def example(self) -> Example:
        rng = self.rng
        if self.where_share > 0 and rng.random() < self.where_share:
            return self.where_example()
        frames, showings = self.context()
        seen = list(dict.fromkeys(name for name, _, _ in showings))
        kinds = ["hour colour", "hour shape", "hour count"] + (["hour order", "hour after"] if len(seen) > 1 else [])
        if self.kind_weights is None:
            kind = kinds[int(rng.integers(len(kinds)))]
        else:
            w = np.array([self.kind_weights.get(k, 1.0) for k in kinds])
            kind = kinds[int(rng.choice(len(kinds), p=w / w.sum()))]
        words = WORDINGS[kind]
        wording = words[int(rng.integers(len(words)))]
        x = seen[int(rng.integers(len(seen)))]
        colour, shape = x.split()
        values: tuple[str, ...]
        if kind == "hour colour":
            q, a, values = wording.format(shape=shape), colour, tuple(COLOURS)
        elif kind == "hour shape":
            q, a, values = wording.format(colour=colour), shape, SHAPES
        elif kind == "hour count":
            a = COUNT_WORDS[sum(1 for name, _, _ in showings if name == x) - 1]
            q, values = wording.format(x=x), COUNT_WORDS
        elif kind == "hour order":
            y = next(s for s in seen if s != x) if rng.random() < 0.5 else seen[int(rng.integers(len(seen)))]
            if y == x:
                y = next(s for s in seen if s != x)
            pair = [x, y] if rng.random() < 0.5 else [y, x]
            q, a, values = wording.format(x=pair[0], y=pair[1]), seen[min(seen.index(x), seen.index(y))], tuple(pair)
        else:  # after: the next other thing shown after x's first showing
            start = next(i for i, (name, _, _) in enumerate(showings) if name == x)
            later = [name for name, _, _ in showings[start + 1 :] if name != x]
            if not later:
                x = seen[0]
                start = 0
                later = [name for name, _, _ in showings[1:] if name != x]
            q, a, values = wording.format(x=x), later[0], tuple(n for n in NAMES if n != x)
        ex = Example(tuple(frames), q, a, kind)
        if rng.random() < self.letter_share:
            ex = with_letter_options(ex, values, rng, n=min(4, len(values)))
        return ex

    def examples(self, n: int) -> list[Example]:
        return [self.example() for _ in range(n)]
