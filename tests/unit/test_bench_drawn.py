"""bench/drawn_frames.py end to end on the random-weight model (the numbers are meaningless; the plumbing is not)."""

from __future__ import annotations

import re

import pytest

from bench.drawn_frames import _named, main
from videokv_node.eval.footage import opencv_data_dir


def test_an_open_answer_names_the_right_value_and_no_other():
    values = ("red", "green", "blue", "yellow")
    assert _named("It was red.", "red", values)
    assert not _named("red or blue", "red", values)
    assert not _named("reddish", "red", values)


@pytest.mark.skipif(opencv_data_dir() is None, reason="the splits' footage is opencv-doc's (scripts/setup_footage.sh)")
def test_a_short_run_writes_every_measure(tmp_path):
    out = tmp_path / "drawn.md"
    assert main(["--model", "videokv-tiny-random", "--frames", "2", "--split", "val", "--out", str(out)]) == 0
    text = out.read_text()
    for measure in ("colour choice", "shape choice", "colour open", "shape open", "words name it"):
        assert f"| {measure} | " in text and "/2 = " in text
    assert "<!-- BEGIN drawn frames val -->" in text
    # the colour choice split by the words: every frame in exactly one of the two rows
    split = [re.search(rf"\| colour choice, {row} \| (\d+)/(\d+)", text) for row in ("the words name it", "they do not")]
    assert all(split) and sum(int(m.group(2)) for m in split) == 2
    assert sum(int(m.group(1)) for m in split) == int(re.search(r"\| colour choice \| (\d+)/2", text).group(1))


@pytest.mark.skipif(opencv_data_dir() is None, reason="the splits' footage is opencv-doc's (scripts/setup_footage.sh)")
def test_context_runs_the_needle_among_other_frames(tmp_path):
    out = tmp_path / "drawn.md"
    assert main(["--model", "videokv-tiny-random", "--frames", "2", "--split", "val", "--context", "3",
                 "--out", str(out)]) == 0
    text = out.read_text()
    assert "<!-- BEGIN drawn frames val-context3 -->" in text and "among 3 other frames" in text
    assert "| words name it | " in text and "/2 = " in text
    with pytest.raises(SystemExit):
        main(["--model", "videokv-tiny-random", "--frames", "1", "--context", "-1", "--out", str(out)])
