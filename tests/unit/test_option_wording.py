"""``tinyvlm/option_wording.py``: the OpenCV frames show what they say, options are written as named, the report renders."""

from __future__ import annotations

import numpy as np
import pytest

from videokv_node.memory.questions.options import option_texts
from videokv_node.tinyvlm.option_wording import COLOURS, FORMATS, frames, report, written


@pytest.mark.parametrize("shape", ["circle", "square", "triangle"])
def test_frames_hold_one_object_of_the_colour(shape):
    rng = np.random.default_rng(0)
    for colour, rgb in COLOURS.items():
        for img in frames(colour, shape, rng, n=3):
            assert img.shape == (240, 320, 3) and img.dtype == np.uint8
            exact = np.all(img == np.asarray(rgb, np.uint8), axis=-1)
            # radius 40-110 px: a circle covers >= pi*40^2, a triangle half of (80 px)^2 (less the background's own pixels)
            assert exact.sum() >= 0.4 * 80 * 80, (colour, shape, exact.sum())


def test_options_are_written_as_named_and_read_back_to_the_same_texts():
    assert written(["red", "green"], "A) label") == ["A) red", "B) green"]
    assert written(["red", "green"], "a X object") == ["a red object", "a green object"]
    assert option_texts(written(["red", "green"], "A) label")) == ["red", "green"]
    assert option_texts(written(["red", "green"], " padded ")) == ["red", "green"]


def test_report_has_a_row_per_format():
    hits = {"colour": {"open": [True, False], **{(f, r): [True] for f in FORMATS for r in ("likelihood", "whole-option mean", "letter")}}}
    text = report(hits, "cmd")
    assert "colour 1/2" in text and text.count("\n| `") == len(FORMATS)
