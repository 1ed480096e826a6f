"""videokv-tiny v5's data about real things (tinyvlm/things.py) and its held-out items (tinyvlm/things_heldout.py):
held out never meets trained, and every question's answer is the one its frames' noun blocks give."""

from __future__ import annotations

import re

import pytest

from bench.things import names_truth, options_for
from videokv_node.models.nouns import article
from videokv_node.tinyvlm.scenes import PHOTOS
from videokv_node.tinyvlm.things import TRAIN_CLIPS, TRAIN_PHOTOS, ThingSampler, majority
from videokv_node.tinyvlm.things_heldout import HELD_OUT_THINGS


def _twin(name: str) -> str:
    """A file's name less what tells the pictures of a stereo pair or sequence apart (aloeL/aloeR,
    motorcycle_left/right, basketball1/2, leuvenA/B)."""
    stem = name.rsplit(".", 1)[0].lower()
    return re.sub(r"(_left|_right|_pristine|_distorted|[lrab]|\d+)$", "", stem)


def test_held_out_pictures_are_never_trained_on_nor_twins_of_trained_ones():
    trained = {*TRAIN_PHOTOS, *TRAIN_CLIPS, *(p.file for p in PHOTOS)}
    for item in HELD_OUT_THINGS:
        name = item.source.split(":")[1]
        assert name not in trained, item
        assert _twin(name) not in {_twin(t) for t in trained}, (item, _twin(name))
        assert item.truth and all(t == t.strip().lower() for t in item.truth)
    assert len({i.source for i in HELD_OUT_THINGS}) == len(HELD_OUT_THINGS) >= 10


def test_twin_rule():
    assert _twin("aloeL.jpg") == _twin("aloeR.jpg") and _twin("motorcycle_left.png") == _twin("motorcycle_right.png")
    assert _twin("basketball1.png") == _twin("basketball2.png") and _twin("apple.jpg") != _twin("orange.jpg")


def test_majority_is_the_most_frequent_first_noun_earliest_on_ties():
    assert majority([[3, 5], [4, 0], [4, 3], [3, 0]]) == 3  # 3 and 4 twice each: 3 came first
    assert majority([[0, 0], [7, 2], [2, 0], [2, 7]]) == 2
    assert majority([[0, 0], [0, 0]]) == 0


def test_names_truth_whole_words_and_plurals():
    assert names_truth("A dog.", ("dog",)) and names_truth("two dogs", ("dog",))
    assert names_truth("a bow tie", ("man", "bow tie")) and not names_truth("a tie", ("bow tie",))
    assert not names_truth("a hotdog", ("dog",)) and not names_truth("a red circle", ("apple", "fruit"))
    assert names_truth("some oranges", ("orange",)) and names_truth("the boxes", ("box",))


def test_options_hold_the_noun_and_three_others_never_a_truth_noun():
    import numpy as np

    table = ["apple", "banana", "car", "dog", "fruit", "mug", "orange"]
    for seed in range(20):
        opts = options_for("apple", table, np.random.default_rng(seed), ("apple", "fruit"))
        assert len(opts) == len(set(opts)) == 4 and "an apple" in opts and "a fruit" not in opts


NOUNS = ["", "apple", "car", "dog", "mug", "orange", "umbrella"]


@pytest.fixture(scope="module")
def sampled():
    sampler = ThingSampler(0, NOUNS, photo_crops=3, frame_crops=2, sources=["opencv:a.jpg", "opencv:b.jpg", "clip:c.mp4:0"])
    scenes = sampler.scenes()
    blocks = {s: [(i % 6) + 1, 0] if i % 4 else [0, 0] for i, s in enumerate(scenes)}  # every 4th crop: no noun
    return sampler, blocks, sampler.questions(400, blocks, scenes, copy_share=0.5)


def test_sampler_draws_the_asked_crops(sampled):
    sampler, blocks, _ = sampled
    assert len(sampler.scenes()) == 3 + 3 + 2
    assert {s.photo for s in sampler.scenes()} == {"opencv:a.jpg", "opencv:b.jpg", "clip:c.mp4:0"}


def test_every_answer_is_the_one_the_frames_blocks_give(sampled):
    _, blocks, examples = sampled
    kinds = {ex.kind for ex in examples}
    assert kinds == {"thing_see", "thing_yesno", "thing_choice"}
    assert 0.3 < sum(ex.nouns is not None for ex in examples) / len(examples) < 0.7
    for ex in examples:
        frame_blocks = [list(b) for b in ex.nouns] if ex.nouns is not None else [blocks[s] for s in ex.scenes]
        assert all(len(b) == 2 for b in frame_blocks)
        seen = {NOUNS[n] for b in frame_blocks for n in b if n}
        if ex.kind == "thing_yesno":
            noun = ex.question.removeprefix("Did you see ").rstrip("?").split(" ", 1)[1]
            assert ex.answer == ("yes" if noun in seen else "no"), ex
            continue
        want = article(NOUNS[frame_blocks[0][0] if len(ex.scenes) == 1 else majority(frame_blocks)])
        if ex.kind == "thing_see":
            assert ex.answer == want and ex.question.endswith("?")
        else:
            assert len(ex.options) == 4 and ex.options[" ABCD".index(ex.answer) - 1] == want
            assert all(o == want or o.split(" ", 1)[1] not in seen for o in ex.options)
