"""videokv-tiny v6's footage with drawn shapes (tinyvlm/drawn.py) and its split by source (eval/footage.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from videokv_node.eval.footage import FOOTAGE_SPLITS, SKIMAGE_PHOTOS, opencv_data_dir
from videokv_node.tinyvlm import things, things_heldout
from videokv_node.tinyvlm.drawn import HELD_OUT_SIDES, SIDE_RANGE, DrawnFrame, DrawnSampler, DrawnThing, render_drawn


# The train and val splits' clips and every split's photographs are opencv-doc's (scripts/setup_footage.sh, which
# `make bench-*` and `make demo` run; a clean `make test` may not have them): those tests skip without them.
needs_opencv = pytest.mark.skipif(opencv_data_dir() is None, reason="opencv-doc's footage not unpacked (scripts/setup_footage.sh)")


def _stem(name: str) -> str:
    """A stereo pair's or a sequence's common stem: aloeL/aloeR -> aloe, left01/right07 -> (left|right), basketball1/2."""
    base = name.rsplit(".", 1)[0]
    base = re.sub(r"(L|R)$", "", base)
    base = re.sub(r"\d+$", "", base)
    return {"left": "stereo", "right": "stereo"}.get(base, base)


def test_splits_share_no_source_nor_a_stereo_twin():
    seen: dict[str, str] = {}
    for split, (clips, photos) in FOOTAGE_SPLITS.items():
        for name in clips + photos:
            stem = _stem(name)
            assert seen.get(stem, split) == split, f"{name} ({split}) and a twin in {seen[stem]}"
            seen[stem] = split


def test_the_test_split_was_never_trained_on():
    clips, photos = FOOTAGE_SPLITS["test"]
    v5_trained = set(things.TRAIN_CLIPS) | set(things.TRAIN_PHOTOS)
    assert not (set(clips) | set(photos)) & v5_trained
    assert not set(photos) & set(SKIMAGE_PHOTOS)  # v1-v4 trained on crops of scikit-image's photographs
    # the held-out real things of issue 34 stay held out: the test split may show them, training never does
    held = {i.source.partition(":")[2].removeprefix("clip:") for i in things_heldout.HELD_OUT_THINGS}
    train_clips, train_photos = FOOTAGE_SPLITS["train"]
    assert not held & (set(train_clips) | set(train_photos))


@needs_opencv
def test_training_frames_never_draw_the_held_out_sizes_and_never_overlap():
    sampler = DrawnSampler("train", seed=3)
    sides = []
    for _ in range(300):
        f = sampler.frame(n_things=3)
        assert f.source in FOOTAGE_SPLITS["train"][0] + FOOTAGE_SPLITS["train"][1]
        for i, a in enumerate(f.things):
            sides.append(a.side)
            assert a.side / 2 <= a.y <= 1 - a.side / 2
            for b in f.things[i + 1:]:  # bounding squares apart, in pixels of the 4:3 frame
                dx, dy = abs(a.x - b.x) * 320, abs(a.y - b.y) * 240
                assert dx >= (a.side + b.side) * 120 - 1e-6 or dy >= (a.side + b.side) * 120 - 1e-6
    assert all(not HELD_OUT_SIDES[0] <= s <= HELD_OUT_SIDES[1] for s in sides)
    assert min(sides) < 0.25 and max(sides) > 0.65 and all(SIDE_RANGE[0] <= s <= SIDE_RANGE[1] for s in sides)
    held = DrawnSampler("test", seed=3, held_out_sizes=True)
    assert all(HELD_OUT_SIDES[0] <= t.side <= HELD_OUT_SIDES[1] for _ in range(50) for t in held.frame(n_things=2).things)


def test_a_spec_renders_the_same_pixels_and_shows_its_shape():
    f = DrawnFrame("bigbuckbunny.mp4", 5, (0.5, 0.5, 1.0), (DrawnThing("blue", "square", 0.5, 0.5, 0.5),),
                   gain=1.0, cast=(1.0, 1.0, 1.0), blur=0.0, noise=0.0, seed=7)
    a, b = render_drawn(f), render_drawn(f)
    assert a.shape == (240, 320, 3) and np.array_equal(a, b)
    centre = a[110:130, 150:170].reshape(-1, 3).astype(int).mean(0)
    assert centre[2] > 170 and centre[0] < 80  # blue (40, 80, 215) +- 20
    assert f.names == ("blue square",)


@needs_opencv
@pytest.mark.parametrize("split", sorted(FOOTAGE_SPLITS))
def test_a_sampler_draws_only_its_split(split):
    clips, photos = FOOTAGE_SPLITS[split]
    s = DrawnSampler(split, seed=1)
    assert {s.frame().source for _ in range(60)} <= set(clips) | set(photos)


def test_colourfulness_against_hand_computed_values():
    from videokv_node.tinyvlm.drawn import colourfulness

    assert colourfulness(np.full((4, 4, 3), 128, np.uint8)) == 0.0  # grey
    red = np.zeros((2, 2, 3), np.uint8)
    red[..., 0] = 200  # R-G = 200, (R+G)/2-B = 100, no spread: 0.3 * hypot(200, 100)
    assert colourfulness(red) == pytest.approx(0.3 * (200**2 + 100**2) ** 0.5)
    half = np.zeros((1, 2, 3), np.uint8)
    half[0, 0] = (100, 0, 0)  # R-G in {100, 0}: std 50, mean 50; (R+G)/2-B in {50, 0}: std 25, mean 25
    assert colourfulness(half) == pytest.approx((50**2 + 25**2) ** 0.5 + 0.3 * (50**2 + 25**2) ** 0.5)


@needs_opencv
def test_the_colourful_training_photographs_are_trains_colourful_ones_without_the_shape_drawings():
    from videokv_node.tinyvlm.drawn import COLOURFUL_MIN, COLOURFUL_TRAIN_PHOTOS, SHAPE_DRAWINGS, _source_image

    def opponent_colourfulness(img: np.ndarray) -> float:  # re-implemented here, not the module's helper
        r, g, b = (img[..., i].astype(float).ravel() for i in range(3))
        rg, yb = r - g, (r + g) / 2 - b
        return float(np.sqrt(np.var(rg) + np.var(yb)) + 0.3 * np.sqrt(np.mean(rg) ** 2 + np.mean(yb) ** 2))

    photos = FOOTAGE_SPLITS["train"][1]
    assert set(SHAPE_DRAWINGS) <= set(photos)
    want = {p for p in photos if opponent_colourfulness(_source_image(p, 0)) >= COLOURFUL_MIN} - set(SHAPE_DRAWINGS)
    assert set(COLOURFUL_TRAIN_PHOTOS) == want
