"""v6's long training examples (tinyvlm/hour_examples.py): answers re-derived from the frames themselves."""

from __future__ import annotations

import pytest

from videokv_node.tinyvlm.drawn import DrawnFrame, DrawnThing
from videokv_node.tinyvlm.hour_examples import COUNT_WORDS, KINDS, NAMES, HourExampleSampler
from videokv_node.models.chat_adapter import OPTION_LETTERS


def _frame(source: str, i: int, thing: str | None = None) -> DrawnFrame:
    things = () if thing is None else (DrawnThing(*thing.split(), 0.5, 0.5, 0.5),)
    return DrawnFrame(source, i, (0.5, 0.5, 1.0), things, 1.0, (1.0, 1.0, 1.0), 0.0, 0.0, i)


@pytest.fixture(scope="module")
def sampler():
    needles = {n: [_frame("needle", k * 100 + j, n) for j in range(5)] for k, n in enumerate(NAMES)}
    shots = [[_frame(f"shot{s}", s * 10 + j) for j in range(6)] for s in range(20)]
    return HourExampleSampler(0, needles, shots, (8, 40), letter_share=0.3)


def showings(frames):
    """Independent reference: runs of consecutive frames showing one thing, as (name, first, last)."""
    out = []
    for i, f in enumerate(frames):
        name = f.things[0].name if f.things else None
        if name is None:
            continue
        if out and out[-1][0] == name and out[-1][2] == i - 1:
            out[-1] = (name, out[-1][1], i)
        else:
            out.append((name, i, i))
    return out


def right(ex) -> str:
    return ex.options[OPTION_LETTERS.index(ex.answer)] if ex.options else ex.answer


def test_answers_rederived_from_the_frames(sampler):
    kinds = set()
    for _ in range(400):
        ex = sampler.example()
        kinds.add(ex.kind)
        runs = showings(ex.scenes)
        seen = list(dict.fromkeys(n for n, _, _ in runs))
        assert 8 <= len(ex.scenes) <= 40 + 6
        assert 2 <= len(seen) <= 3 and len({n.split()[0] for n in seen}) == len(seen) == len({n.split()[1] for n in seen})
        answer, q = right(ex), ex.question
        if ex.kind == "hour colour":
            shape = next(s for s in ("circle", "square", "triangle") if s in q)
            assert f"{answer} {shape}" in seen
        elif ex.kind == "hour shape":
            colour = next(c for c in ("red", "green", "blue", "yellow") if c in q)
            assert f"{colour} {answer}" in seen
        elif ex.kind == "hour count":
            x = next(n for n in seen if n in q)
            assert answer == COUNT_WORDS[sum(1 for n, _, _ in runs if n == x) - 1]
        elif ex.kind == "hour order":
            named = sorted((q.index(n), n) for n in seen if n in q)
            assert len(named) == 2
            assert answer == min((n for _, n in named), key=seen.index)
        else:
            x = next(n for n in seen if f"the {n}" in q)
            first = next(i for i, r in enumerate(runs) if r[0] == x)
            assert answer == next(n for n, _, _ in runs[first + 1:] if n != x)
        if ex.options:
            assert ex.answer in OPTION_LETTERS[: len(ex.options)] and len(set(ex.options)) == len(ex.options)
    assert kinds == set(KINDS)


def test_showings_are_apart_and_counts_as_the_hours(sampler):
    for _ in range(200):
        frames, shown = sampler.context()
        assert shown == showings(frames)  # every showing a run of its own: never two touching
        counts = sorted(sum(1 for n, _, _ in shown if n == x) for x in {n for n, _, _ in shown})
        assert counts[:-1] == [1] * (len(counts) - 1) and 1 <= counts[-1] <= 3
        assert all(1 <= last - first + 1 <= 3 for _, first, last in shown)


def test_same_seed_same_examples():
    needles = {n: [_frame("needle", k * 100 + j, n) for j in range(3)] for k, n in enumerate(NAMES)}
    shots = [[_frame(f"shot{s}", s * 10 + j) for j in range(4)] for s in range(5)]
    a = HourExampleSampler(3, needles, shots).examples(20)
    b = HourExampleSampler(3, needles, shots).examples(20)
    assert a == b
    with pytest.raises(ValueError, match="no needle frames"):
        HourExampleSampler(0, {}, shots)


def test_kind_weights_shift_the_mixture_and_bad_ones_are_refused():
    """Weights 3:3:1:1:1 give colour and shape about 3/9 each where order and after are allowed (2 things or more),
    3/7 where only colour, shape and count are; uniform gives 1/5 to 1/3. 600 examples: well apart."""
    needles = {n: [_frame("needle", k * 100 + j, n) for j in range(3)] for k, n in enumerate(NAMES)}
    shots = [[_frame(f"shot{s}", s * 10 + j) for j in range(6)] for s in range(10)]
    weighted = HourExampleSampler(1, needles, shots, (8, 16), 0.0, {"hour colour": 3, "hour shape": 3}).examples(600)
    plain = HourExampleSampler(1, needles, shots, (8, 16), 0.0).examples(600)
    share = lambda exs: sum(ex.kind in ("hour colour", "hour shape") for ex in exs) / len(exs)
    assert share(weighted) > 0.62 and share(plain) < 0.48
    for ex in weighted:  # the answers stay right under the weights
        if ex.kind == "hour colour":
            assert any(f.things and f.things[0].colour == ex.answer for f in ex.scenes)
    with pytest.raises(ValueError, match="kind weights"):
        HourExampleSampler(1, needles, shots, kind_weights={"colour": 2})
    with pytest.raises(ValueError, match="kind weights"):
        HourExampleSampler(1, needles, shots, kind_weights={"hour colour": 0})


def _pools():
    needles = {n: [_frame("needle", k * 100 + j, n) for j in range(3)] for k, n in enumerate(NAMES)}
    shots = [[_frame(f"shot{s}", s * 10 + j) for j in range(6)] for s in range(10)]
    photos = [_frame(f"photo{p}", 9000 + p) for p in range(4)]
    return needles, shots, photos


def test_touching_and_glimpses_off_draw_what_runs_1_to_7_drew():
    """The new options at 0 consume nothing of the generator: the recorded runs' examples are drawn again."""
    needles, shots, photos = _pools()
    assert (HourExampleSampler(5, needles, shots).examples(30)
            == HourExampleSampler(5, needles, shots, glimpses=photos, touching_share=0.0, glimpse_share=0.0).examples(30))


def test_touching_showings_are_back_to_back_and_counts_stay_defined():
    needles, shots, photos = _pools()
    sampler = HourExampleSampler(2, needles, shots, (8, 24), 0.0, touching_share=1.0, glimpses=photos, glimpse_share=1.0)
    touched = glimpsed = 0
    for _ in range(200):
        frames, shown = sampler.context()
        assert shown == showings(frames)  # two showings of one thing never touch: a count is still what it says
        first, last = shown[0][1], shown[-1][2]
        between = frames[first : last + 1]
        background = [f.source.startswith("shot") for f in between]
        glimpsed += any(f.source.startswith("photo") for f in frames)
        # no background between the showings but the one frame two showings of one thing need
        same = sum(1 for a, b in zip(shown, shown[1:]) if a[0] == b[0])
        assert sum(background) <= same
        touched += any(b[1] == a[2] + 1 for a, b in zip(shown, shown[1:]))
    assert touched > 150 and glimpsed == 200
    for ex in sampler.examples(300):  # glimpses are never an answer nor named in a question
        assert "photo" not in ex.question and ex.answer not in {f.source for f in photos}
        if ex.kind == "hour after":
            runs = showings(ex.scenes)
            x = next(n for n, _, _ in runs if f"the {n}" in ex.question)
            at = next(i for i, r in enumerate(runs) if r[0] == x)
            assert right(ex) == next(n for n, _, _ in runs[at + 1 :] if n != x)


def test_bad_shares_are_refused():
    needles, shots, photos = _pools()
    with pytest.raises(ValueError, match="glimpse_share"):
        HourExampleSampler(1, needles, shots, glimpse_share=0.5)  # no glimpses to show
    with pytest.raises(ValueError, match="touching_share"):
        HourExampleSampler(1, needles, shots, touching_share=1.5)


def test_where_examples_answer_the_third_holding_the_things_centre():
    """The answer re-derived from the frames: the one thing shown (1 to 8 frames in a row, one frame repeated) and the
    third of the frame its centre lies in, counted by hand for x = 0.1 .. 0.9."""
    from videokv_node.tinyvlm.hour_examples import WHERE_KIND

    xs = (0.1, 0.3, 0.32, 0.5, 0.66, 0.7, 0.9)
    by_hand = {0.1: "left", 0.3: "left", 0.32: "left", 0.5: "middle", 0.66: "middle", 0.7: "right", 0.9: "right"}
    needles = {n: [DrawnFrame("needle", k * 100 + j, (0.5, 0.5, 1.0), (DrawnThing(*n.split(), x, 0.5, 0.3),),
                              1.0, (1.0, 1.0, 1.0), 0.0, 0.0, j) for j, x in enumerate(xs)] for k, n in enumerate(NAMES)}
    shots = [[_frame(f"shot{s}", s * 10 + j) for j in range(6)] for s in range(20)]
    sampler = HourExampleSampler(3, needles, shots, (8, 20), letter_share=0.5, where_share=0.5)
    wheres, others, places = 0, 0, set()
    for _ in range(300):
        ex = sampler.example()
        if ex.kind != WHERE_KIND:
            others += 1
            continue
        wheres += 1
        runs = showings(ex.scenes)
        assert len(runs) == 1 and 1 <= runs[0][2] - runs[0][1] + 1 <= 8
        shown = ex.scenes[runs[0][1]]
        assert all(f == shown for f in ex.scenes[runs[0][1] : runs[0][2] + 1])
        assert shown.things[0].name in ex.question and len(ex.scenes) >= 8
        assert right(ex) == by_hand[shown.things[0].x]
        places.add(right(ex))
    assert 100 < wheres < 200 and others > 100 and places == {"left", "middle", "right"}
    with pytest.raises(ValueError, match="where_share"):
        HourExampleSampler(1, needles, shots, where_share=-0.1)
