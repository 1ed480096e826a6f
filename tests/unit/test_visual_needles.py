"""Visual needle streams (``eval/visual_needles.py``): seeded, one telling frame per question, early."""

from __future__ import annotations

import numpy as np
import pytest

from videokv_node.eval.visual_needles import QUESTION_TYPES, make_visual_stream, make_visual_streams
from videokv_node.tinyvlm.render import render


def test_the_same_seed_gives_the_same_streams_and_another_seed_others():
    assert make_visual_streams(3, 12, seed=5) == make_visual_streams(3, 12, seed=5)
    assert make_visual_streams(3, 12, seed=5) != make_visual_streams(3, 12, seed=6)


@pytest.mark.parametrize("seed", range(25))
def test_each_answer_is_in_exactly_one_early_frame_and_every_other_frame_is_empty(seed):
    stream = make_visual_stream("s", 16, np.random.default_rng(seed))
    scenes = dict(stream.frames)
    stamps = [t for t, _ in stream.frames]
    assert stamps == sorted(set(stamps))
    assert [q.question_type for q in stream.questions] == list(QUESTION_TYPES)
    shape_frames = [s for s in scenes.values() if s.shapes]
    digit_frames = [s for s in scenes.values() if s.digit is not None]
    assert len(shape_frames) == 1 and len(digit_frames) == 1 and len(shape_frames[0].shapes) == 1
    for q in stream.questions:
        assert len(set(q.choices)) == len(q.choices) >= 3
        (stamp,) = q.evidence_stamps
        assert stamp <= stream.duration / 2
        needle = scenes[stamp]
        right = q.choices[q.answer]
        if q.question_type == "digit":
            assert needle.digit == right
            assert q.subject == f"the number {needle.digit}"  # ~/locate's query for the needle frame
        else:
            shape = needle.shapes[0]
            assert right == {"colour": shape.colour, "shape": shape.shape, "position": shape.column}[q.question_type]
            assert q.subject == f"the {shape.colour} {shape.shape}"


def test_empty_frames_are_the_background_alone():
    stream = make_visual_stream("s", 8, np.random.default_rng(0))
    empty = next(s for _, s in stream.frames if not s.shapes and s.digit is None)
    rgb = render(empty)
    assert rgb.shape == (224, 224, 3)
    assert np.all(rgb == rgb[0, 0])  # one flat tint: nothing drawn


def test_too_short_a_stream_is_refused():
    with pytest.raises(ValueError, match="at least 4 frames"):
        make_visual_stream("s", 3, np.random.default_rng(0))
