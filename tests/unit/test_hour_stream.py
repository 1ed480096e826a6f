"""Hour streams of real footage (eval/footage.py, eval/hour_stream.py) and their questions (eval/hour_questions.py).

The truths are re-derived here from the stream's appearances, not taken from the question module."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from videokv_node.eval.footage import FootageLibrary, sensor_noise, view
from videokv_node.eval.hour_questions import COUNT_WORDS, KINDS, hour_questions, locate_truths
from videokv_node.eval.hour_stream import STILL_FRAMES, make_hour_stream
from videokv_node.tinyvlm.hour_examples import WORDINGS as HOUR_TRAINING_WORDINGS
from videokv_node.tinyvlm.scenes import COLOURS, SHAPES
from videokv_node.tinyvlm.variety import HELD_OUT_WORDINGS, WORDINGS

N = 1800


@pytest.fixture(scope="module")
def library():
    return FootageLibrary.load(with_opencv=False)


@pytest.fixture(scope="module")
def stream(library):
    return make_hour_stream("h", N, 3, library)


def _digest(rgb: np.ndarray) -> str:
    return hashlib.sha256(rgb.tobytes()).hexdigest()


def test_same_seed_same_pixels_and_questions(library, stream):
    again = make_hour_stream("h", N, 3, library)
    for i in (0, 777, N - 1, stream.appearances[0].frames[0]):
        assert _digest(stream.frame(i)) == _digest(again.frame(i))
    assert hour_questions(stream) == hour_questions(again)
    other = make_hour_stream("h", N, 4, library)
    assert _digest(other.frame(777)) != _digest(stream.frame(777))


def test_shots_cover_the_stream_and_look_like_a_robots_day(stream):
    start = 0
    for shot in stream.shots:
        assert shot.start == start and shot.length >= 1
        start += shot.length
    assert start == N
    kinds = {s.kind for s in stream.shots}
    assert kinds == {"clip", "pan", "still"}
    for s in stream.shots[:-1]:  # the last is cut to fit
        if s.kind == "still":
            assert STILL_FRAMES[0] <= s.length < STILL_FRAMES[1]
    places = [s.place for s in stream.shots]
    assert len(set(places)) < len(places), "no place is revisited"
    assert stream.frame(0).shape == (480, 640, 3) and stream.frame(0).dtype == np.uint8


def test_a_still_stretch_changes_by_sensor_noise_only(stream):
    still = next(s for s in stream.shots if s.kind == "still" and s.length > 10)
    shown = {f for a in stream.appearances for f in a.frames}
    i = next(f for f in range(still.start, still.start + still.length - 1) if f not in shown and f + 1 not in shown)
    a, b = stream.frame(i).astype(float), stream.frame(i + 1).astype(float)
    assert 0 < np.abs(a - b).mean() < 3 * still.noise  # fresh noise, the same view


def test_things_are_drawn_where_and_when_they_appear(stream):
    counts = {}
    for a in stream.appearances:
        counts[a.thing] = counts.get(a.thing, 0) + 1
        assert list(a.frames) == list(range(a.frames[0], a.frames[0] + len(a.frames))) and 1 <= len(a.frames) <= 3
        assert N // 50 <= a.frames[0] and a.frames[-1] < N - N // 50
        thing = stream.things[a.thing]
        rgb = stream.frame(a.frames[0])
        h, w = rgb.shape[:2]
        centre = rgb[int(a.y * h) - 3:int(a.y * h) + 4, int(a.x * w) - 3:int(a.x * w) + 4].reshape(-1, 3).mean(0)
        assert np.abs(centre - np.array(COLOURS[thing.colour])).max() < 40, (thing, centre)
    assert sorted(counts) == [0, 1, 2]
    assert sorted(counts.values()) in ([1, 1, 2], [1, 1, 3])  # one thing is seen again
    assert len({t.colour for t in stream.things}) == len({t.shape for t in stream.things}) == 3


def test_questions_truth_rederived(stream):
    questions = hour_questions(stream)
    middle = N // 2 - 1
    assert {q.kind for q in questions} == set(KINDS)
    assert 12 <= len(questions) <= 22
    first = {t: min(a.frames[0] for a in stream.appearances if a.thing == t) for t in range(3)}
    by_name = {t.name: i for i, t in enumerate(stream.things)}
    for q in questions:
        assert q.ask_after in (middle, 3 * N // 4 - 1, N - 1)
        assert all(f <= q.ask_after for g in q.evidence for f in g), "a question about what was not seen yet"
        right = q.choices[q.answer]
        assert len(set(q.choices)) == len(q.choices)
        if q.kind == "colour":
            thing = next(t for t in stream.things if t.shape in q.question)
            assert right == thing.colour
        elif q.kind == "shape":
            thing = next(t for t in stream.things if f"the {t.colour} " in q.question)
            assert right == thing.shape
        elif q.kind == "order":
            a, b = (by_name[c] for c in q.choices)
            assert right == q.choices[0 if first[a] < first[b] else 1]
        elif q.kind == "count":
            thing = next(i for n, i in by_name.items() if f"the {n}?" in q.question)
            seen = [a for a in stream.appearances if a.thing == thing and a.frames[-1] <= q.ask_after]
            assert right == COUNT_WORDS[len(seen) - 1]
        elif q.kind == "after":
            x = next(i for n, i in by_name.items() if q.question.endswith(f"the {n}?"))
            later = [a for a in stream.appearances if a.frames[0] > first[x] and a.thing != x]
            assert right == stream.things[min(later, key=lambda a: a.frames[0]).thing].name


def test_wordings_are_not_trainings(stream):
    trained = {w for ws in WORDINGS.values() for w in ws} | {w for ws in HELD_OUT_WORDINGS.values() for w in ws}
    trained |= {"What colour is the shape?", "What shape is it?", "How many shapes are there?"}
    # v6's long examples (tinyvlm/hour_examples.py), every template filled with this stream's things
    names = [t.name for t in stream.things]
    for template in (w for ws in HOUR_TRAINING_WORDINGS.values() for w in ws):
        trained |= {template.format(shape=s, colour=c, x=x, y=y) for s in SHAPES for c in COLOURS for x in names for y in names}
    for q in hour_questions(stream):
        assert q.question not in trained


def test_locate_truths_name_every_thing(stream):
    truths = locate_truths(stream)
    assert [t.query for t in truths] == [t.subject for t in stream.things]
    for t, truth in enumerate(truths):
        assert truth.last_frame == max(f for a in stream.appearances if a.thing == t for f in a.frames)


def test_view_and_noise():
    img = np.zeros((100, 200, 3), np.uint8)
    img[:, 100:] = 255
    left = view(img, 0.0, 0.5, 2.0, (40, 30))  # the centre is moved inward, the window stays in the left half
    assert left.shape == (30, 40, 3) and left.max() == 0
    rng = np.random.default_rng(0)
    noisy = sensor_noise(np.full((50, 50, 3), 128, np.uint8), rng, 3.0)
    assert 2.5 < noisy.astype(float).std() < 3.5


REAL = ("opencv:chicky_512.png", "opencv:licenseplate_motion.jpg", "opencv:butterfly.jpg")


def test_real_things_are_glimpsed_once_and_change_nothing_else(library, stream):
    """``real_things``: each held-out photograph in 1-3 consecutive frames once, away from every other appearance
    and from the stream's ends; the shots, shapes, questions and every other frame as without them; their locate
    truths after the shapes', named by their first truth noun. Unknown sources are refused."""
    from videokv_node.eval.footage import opencv_data_dir

    if opencv_data_dir() is None:
        pytest.skip("opencv-doc's photographs not unpacked (scripts/setup_footage.sh)")
    real = make_hour_stream("h", N, 3, library, real_things=REAL)
    assert (real.shots, real.things, real.appearances) == (stream.shots, stream.things, stream.appearances)
    assert hour_questions(real) == hour_questions(stream)
    assert [t.noun for t in real.real_things] == ["dog", "car", "butterfly"]
    assert sorted(a.thing for a in real.real_appearances) == [0, 1, 2]
    shapes = [f for a in stream.appearances for f in a.frames]
    for a in real.real_appearances:
        assert 1 <= len(a.frames) <= 3 and list(a.frames) == list(range(a.frames[0], a.frames[-1] + 1))
        assert N // 50 <= a.frames[0] and a.frames[-1] < N - N // 50
        assert min(abs(f - s) for f in a.frames for s in shapes) >= 3
        f = a.frames[0]
        assert _digest(real.frame(f)) != _digest(stream.frame(f))  # the photograph, not the shot
        assert _digest(real.frame(f + len(a.frames))) == _digest(stream.frame(f + len(a.frames)))  # the shot again
    truths = locate_truths(real)
    assert [t.query for t in truths[len(stream.things):]] == ["the dog", "the car", "the butterfly"]
    assert [t.appearances for t in truths[len(stream.things):]] == [
        tuple(a.frames for a in real.real_appearances if a.thing == k) for k in range(3)]
    with pytest.raises(ValueError, match="unknown real things"):
        make_hour_stream("h", N, 3, library, real_things=("opencv:nothing.jpg",))


def test_a_real_things_locate_truth_holds_the_footage_that_shows_its_photograph():
    """A held-out photograph the footage also pans over (opencv-doc's squirrel) is shown by those shots' frames
    as much as by its glimpse: its ``~/locate`` truth holds both (re-derived from the shots here)."""
    from videokv_node.eval.footage import opencv_data_dir

    if opencv_data_dir() is None:
        pytest.skip("opencv-doc's photographs not unpacked (scripts/setup_footage.sh)")
    library = FootageLibrary.load()
    real = make_hour_stream("h", N, 0, library, real_things=("opencv:squirrel_cls.jpg", "opencv:chicky_512.png"))
    pans = [tuple(range(s.start, s.start + s.length)) for s in real.shots if s.source == "squirrel_cls.jpg"]
    assert pans, "seed 0's footage shows squirrel_cls.jpg (the case under test)"
    squirrel, dog = locate_truths(real)[len(real.things):]
    glimpse = [a.frames for a in real.real_appearances if a.thing == 0]
    assert set(squirrel.appearances) == set(glimpse + pans) and list(squirrel.appearances) == sorted(squirrel.appearances)
    assert dog.appearances == tuple(a.frames for a in real.real_appearances if a.thing == 1)  # not in the footage
