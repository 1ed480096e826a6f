"""``python -m bench.accuracy --model videokv-tiny``'s plumbing, on the random-weight variant: every
policy runs on visual needle streams (MuKV's patch split fitted to 6 tokens a frame) and the
section is rendered. Its accuracy means nothing; the real run is ``make bench-accuracy``."""

from __future__ import annotations

from bench import accuracy
from videokv_node.eval.visual_needles import make_visual_streams


def test_every_cell_answers_every_question_of_a_visual_stream(capsys):
    assert accuracy.main(["--model", "videokv-tiny-random", "--streams", "1", "--frames", "4", "--out", "-"]) == 0
    section = capsys.readouterr().out
    assert "videokv-tiny, visual needle streams" in section
    labels = [c.label for c in accuracy.cells(4)]
    assert len(labels) == 1 + len(accuracy.POLICIES) * len(accuracy.BUDGETS)
    for label in labels:  # one row in the main table, one in the per-type table
        assert sum(line.startswith(f"| {label} |") for line in section.splitlines()) == 2, label
    assert "cloze colour" in section and "cloze digit" in section


def test_mukv_patch_split_divides_the_frame_and_retrieval_fits_the_budget():
    for T, tokens in ((6, 6), (6, 30), (24, 96)):
        cfg = accuracy.mukv_retrieval(tokens, T)
        assert T % cfg.patch_split == 0
        assert cfg.retrieve_frame >= 1
    assert accuracy.mukv_retrieval(96, 24).patch_split == accuracy.MUKV_PAPER.patch_split


def test_visual_streams_become_picture_frames_stamped_in_ns():
    (stream,) = make_visual_streams(1, 4, seed=0)
    frames = accuracy.stream_frames(stream)
    assert [f.stamp_ns for f in frames] == [round(t * 1e9) for t, _ in stream.frames]
    assert all(f.rgb.shape == (224, 224, 3) for f in frames)
