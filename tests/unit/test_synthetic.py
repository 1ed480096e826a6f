"""The synthetic camera: deterministic frames whose pixels agree with their ground truth."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from videokv_node.synthetic import (
    COLOURS,
    ObjectEvents,
    Scenario,
    ScriptedDigit,
    ScriptedObject,
    SyntheticScene,
    VisibleObject,
    default_scenario,
)


@pytest.fixture(scope="module")
def scene() -> SyntheticScene:
    return SyntheticScene()


def test_frames_are_rgb_uint8_of_the_requested_size(scene):
    img = scene.frame(0)
    assert img.shape == (240, 320, 3) and img.dtype == np.uint8 and img.flags.c_contiguous
    assert SyntheticScene(width=64, height=48).frame(3).shape == (48, 64, 3)
    assert len(scene) == 60


def test_same_seed_same_bytes_other_seed_other_texture_same_truth():
    a, b, c = SyntheticScene(seed=1), SyntheticScene(seed=1), SyntheticScene(seed=2)
    for i in (0, 25, 59):
        assert a.frame(i).tobytes() == b.frame(i).tobytes()
        assert a.truth(i) == c.truth(i)
    assert a.frame(0).tobytes() != c.frame(0).tobytes()
    assert a.frame(40).tobytes() == a.frame(40).tobytes()  # call order does not matter
    assert not np.shares_memory(a.frame(0), a.frame(0))


def test_plain_background_is_uniform():
    img = SyntheticScene(textured=False).frame(0)  # nothing in view in frame 0
    assert np.all(img == 128)


def test_pixel_at_every_visible_centre_has_the_object_colour(scene):
    seen = 0
    for i in range(len(scene)):
        img, truth = scene.frame(i), scene.truth(i)
        for obj in truth.objects:
            x, y = obj.centre
            assert tuple(img[y, x]) == COLOURS[obj.colour], (i, obj)
            seen += 1
    assert seen > 60


def test_shapes_cover_their_expected_area(scene):
    img = scene.frame(25)
    objs = {o.colour: o for o in scene.truth(25).objects}
    sq, ball = objs["red"], objs["blue"]
    red = np.all(img == COLOURS["red"], axis=-1)
    assert red.sum() == sq.size * sq.size  # the whole square, nothing else red
    blue = np.all(img == COLOURS["blue"], axis=-1)
    assert abs(blue.sum() - np.pi * (ball.size / 2) ** 2) < 0.1 * ball.size ** 2
    cone = scene.truth(55).objects[-1]
    assert cone.shape == "triangle"
    yellow = np.all(scene.frame(55) == COLOURS["yellow"], axis=-1)
    assert abs(yellow.sum() - cone.size ** 2 / 2) < 0.15 * cone.size ** 2


def test_default_scenario_events(scene):
    events = scene.events_summary()
    assert [(e.name, e.shape, e.colour, e.first_frame, e.last_frame) for e in events] == [
        ("toolbox", "square", "red", 6, 59),
        ("apple", "circle", "green", 12, 29),
        ("ball", "circle", "blue", 21, 38),
        ("digit 7", "digit", "white", 30, 47),
        ("cone", "triangle", "yellow", 51, 59),
    ]
    assert events[2] == ObjectEvents("ball", "circle", "blue", 21, 38, 10_500_000_000, 19_000_000_000)


def test_truth_stamps_captions_and_digit(scene):
    assert scene.truth(0).caption == "Nothing in view."
    assert scene.truth(3).stamp_ns == 1_500_000_000  # 2 fps
    t = scene.truth(35)
    assert t.digit == 7 and "The digit 7 is shown" in t.caption
    assert "a blue circle at the top left moving left" in t.caption
    assert "a red square at the bottom left" in t.caption and "moving" not in t.caption.split(",")[0]
    assert scene.truth(10).objects == (VisibleObject("square", "red", (42, 172), 53),)
    assert "moving right" in scene.truth(10).caption
    white = np.all(scene.frame(35) == COLOURS["white"], axis=-1)
    assert white.sum() > 50 and not np.any(np.all(scene.frame(29) == COLOURS["white"], axis=-1))


def test_ball_moves_right_to_left(scene):
    xs = [next(o.centre[0] for o in scene.truth(i).objects if o.colour == "blue") for i in range(21, 39)]
    assert xs == sorted(xs, reverse=True) and xs[0] > 280 and xs[-1] < 40


def test_frames_iterates_with_offset_stamps(scene):
    items = list(scene.frames(4, start_stamp_ns=1_000))
    assert [s for s, _, _ in items] == [1_000, 500_001_000, 1_000_001_000, 1_500_001_000]
    assert all(t.stamp_ns == s and t.index == i for i, (s, _, t) in enumerate(items))
    assert len(list(scene)) == 60
    with pytest.raises(ValueError):
        list(scene.frames(61))
    with pytest.raises(IndexError):
        scene.frame(60)
    with pytest.raises(IndexError):
        scene.truth(-1)


def test_objects_leaving_the_image_are_not_visible():
    obj = ScriptedObject("runner", "square", "orange", 0.2, 0, 10, ((0, 0.5, 0.5), (9, 1.5, 0.5)))
    scene = SyntheticScene(scenario=Scenario(10, (obj,)))
    visible = [bool(scene.truth(i).objects) for i in range(10)]
    assert visible == [True] * 5 + [False] * 5  # centre leaves at x = 0.5 + i / 9 > 1
    assert scene.events_summary()[0].last_frame == 4


def test_scripts_are_validated():
    with pytest.raises(ValueError):
        ScriptedObject("x", "hexagon", "red", 0.1, 0, 5, ((0, 0.5, 0.5),))
    with pytest.raises(ValueError):
        ScriptedObject("x", "square", "mauve", 0.1, 0, 5, ((0, 0.5, 0.5),))
    with pytest.raises(ValueError):
        ScriptedObject("x", "square", "red", 0.1, 5, 5, ((0, 0.5, 0.5),))
    with pytest.raises(ValueError):
        ScriptedObject("x", "square", "red", 0.1, 0, 5, ((3, 0.5, 0.5), (3, 0.6, 0.5)))
    with pytest.raises(ValueError):
        ScriptedDigit(10, "white", 0, 5, 0.5, 0.5)
    with pytest.raises(ValueError):
        Scenario(0, ())
    with pytest.raises(ValueError):
        default_scenario(19)
    with pytest.raises(ValueError):
        SyntheticScene(fps=0)


@given(digit=st.integers(0, 9), x=st.floats(0.0, 1.0), y=st.floats(0.0, 1.0), size=st.floats(0.05, 0.6))
@settings(max_examples=50, deadline=None)
def test_property_digits_and_edge_shapes_draw_without_error(digit, x, y, size):
    objs = tuple(ScriptedObject(s, s, c, size, 0, 2, ((0, x, y),))
                 for s, c in (("square", "red"), ("circle", "blue"), ("triangle", "green")))
    scene = SyntheticScene(64, 48, scenario=Scenario(2, objs, ScriptedDigit(digit, "white", 0, 2, x, y, size)))
    img, truth = scene.frame(1), scene.truth(1)
    assert truth.digit == digit and len(truth.objects) == 3
    top = truth.objects[-1]  # drawn last: its centre pixel is its own
    assert tuple(img[top.centre[1], top.centre[0]]) == COLOURS[top.colour]


def test_a_thousand_frames_stream_one_at_a_time():
    """A long scene is made frame by frame (a generator of fresh arrays, stamps strictly increasing), never
    held whole. How fast it renders is not asserted here (speed belongs in benchmarks, not unit tests)."""
    scene = SyntheticScene(scenario=default_scenario(1000))
    frames = iter(scene)
    stamp0, img0, _ = next(frames)
    img0[...] = 0  # a fresh array: writing into it changes no later frame
    stamps, n = [stamp0], 1
    for stamp, img, truth in frames:
        assert img.shape == (scene.height, scene.width, 3) and img.dtype == np.uint8 and img.any()
        stamps.append(stamp)
        n += 1
    assert n == 1000 and all(b > a for a, b in zip(stamps, stamps[1:]))
