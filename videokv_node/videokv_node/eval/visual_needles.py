"""Visual needle streams for ``videokv-tiny``: two telling frames among empty ones, asked about at the end.

The picture counterpart of ``eval/needles.py`` (text frames for SmolLM2), in the scenes
``videokv-tiny`` was trained on (``tinyvlm/scenes.py``). A stream is ``n_frames``
rendered frames, ``period_s`` apart; all but two show an empty table (the light background
alone). In the first ``needle_span`` of the stream, one frame shows a single coloured shape in
one column and another a printed digit. After the last frame, four questions, each with its
options (the right one among them):
- ``colour``: "What colour is the shape?" (the 4 colours; chance 1/4);
- ``shape``: "What shape is it?" (the 3 shapes; 1/3);
- ``position``: "Where is the shape?" (left / middle / right; 1/3);
- ``digit``: "What number is written?" (the digit and 3 others; 1/4).
Each answer rests on exactly one frame (its ``evidence_stamps``), at least half a stream old
when asked: a memory must keep or retrieve it out of many that show nothing. The questions
are worded as in training, so what is measured is what the memory loses, not the wording.
Everything comes from one ``numpy`` Generator: the same seed gives the same streams everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from videokv_node.eval.needles import NeedleQuestion
from videokv_node.tinyvlm.render import render
from videokv_node.tinyvlm.scenes import COLOURS, COLUMNS, DIGITS, SHAPES, Scene, Shape

QUESTION_TYPES = ("colour", "shape", "position", "digit")


@dataclass(frozen=True, slots=True)
class VisualNeedleStream:
    video_id: str
    frames: tuple[tuple[float, Scene], ...]  # (stamp s, scene), stamps increasing
    questions: tuple[NeedleQuestion, ...]  # all asked after the last frame

    @property
    def duration(self) -> float:
        return self.frames[-1][0]

    def pixels(self) -> list[tuple[float, np.ndarray]]:
        """(stamp s, (224, 224, 3) uint8 RGB) per frame."""
        return [(stamp, render(scene)) for stamp, scene in self.frames]


def _question(rng: np.random.Generator, text: str, answer: str, pool: tuple[str, ...], qtype: str, stamp: float,
              subject: str) -> NeedleQuestion:
    """Up to 4 options drawn from ``pool`` (all of it when it has 4 or fewer), the answer among them, shuffled."""
    others = [p for p in pool if p != answer]
    others = [others[i] for i in rng.permutation(len(others))[:3]]
    choices = [answer, *others]
    choices = [choices[i] for i in rng.permutation(len(choices))]
    return NeedleQuestion(text, tuple(choices), choices.index(answer), qtype, (stamp,), subject)


def make_visual_stream(video_id: str, n_frames: int, rng: np.random.Generator, period_s: float = 2.0,
                       needle_span: float = 0.5) -> VisualNeedleStream:
    if n_frames < 4:
        raise ValueError("a visual needle stream needs at least 4 frames (two needles in its first half)")
    span = max(2, int(n_frames * needle_span))
    shape_at, digit_at = (int(i) for i in rng.choice(span, 2, replace=False))
    shape = Shape(str(rng.choice(list(COLOURS))), str(rng.choice(SHAPES)), str(rng.choice(list(COLUMNS))))
    digit = str(rng.choice(list(DIGITS)))
    frames = []
    for i in range(n_frames):
        seed = int(rng.integers(2**31))
        scene = Scene((shape,), seed=seed) if i == shape_at else Scene(digit=digit, seed=seed) if i == digit_at else Scene(seed=seed)
        frames.append((i * period_s, scene))
    s_stamp, d_stamp = shape_at * period_s, digit_at * period_s
    thing, number = f"the {shape.colour} {shape.shape}", f"the number {digit}"  # ~/locate's queries (subject)
    questions = (
        _question(rng, "What colour is the shape?", shape.colour, tuple(COLOURS), "colour", s_stamp, thing),
        _question(rng, "What shape is it?", shape.shape, SHAPES, "shape", s_stamp, thing),
        _question(rng, "Where is the shape?", shape.column, tuple(COLUMNS), "position", s_stamp, thing),
        _question(rng, "What number is written?", digit, tuple(DIGITS), "digit", d_stamp, number),
    )
    return VisualNeedleStream(video_id, tuple(frames), questions)


def make_visual_streams(n_streams: int, n_frames: int, seed: int = 0, period_s: float = 2.0) -> list[VisualNeedleStream]:
    rng = np.random.default_rng(seed)
    return [make_visual_stream(f"visual-needles-{i:03d}", n_frames, rng, period_s) for i in range(n_streams)]
