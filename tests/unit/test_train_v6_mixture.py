"""train_v6's draw of v5's examples into the mixture: plain (distinct, as v6-run1..3) or weighted by kind."""

from collections import Counter

import pytest

from videokv_node.tinyvlm.mixture import parse_weights, v5_pick

KINDS = ["colour"] * 60 + ["shape"] * 30 + ["motion"] * 5 + ["digit"] * 5


def test_without_weights_the_pick_is_distinct_and_at_most_all():
    pick = v5_pick(KINDS, 40, None, 3)
    assert len(pick) == len(set(pick)) == 40
    assert sorted(v5_pick(KINDS, 500, None, 3)) == list(range(len(KINDS)))


def test_weights_raise_a_rare_kind_to_its_expected_share():
    n = 20000
    counts = Counter(KINDS[i] for i in v5_pick(KINDS, n, {"motion": 10}, 1))
    # by hand: motion's mass is 5 * 10 = 50 of 60 + 30 + 50 + 5 = 145
    assert counts["motion"] / n == pytest.approx(50 / 145, abs=0.02)
    assert counts["digit"] / n == pytest.approx(5 / 145, abs=0.01)


def test_the_pick_is_seeded():
    assert v5_pick(KINDS, 50, {"digit": 4}, 7) == v5_pick(KINDS, 50, {"digit": 4}, 7)
    assert v5_pick(KINDS, 50, {"digit": 4}, 7) != v5_pick(KINDS, 50, {"digit": 4}, 8)


@pytest.mark.parametrize("weights", [{"moton": 2}, {"motion": 0}, {"motion": -1}])
def test_unknown_kinds_and_non_positive_weights_are_refused(weights):
    with pytest.raises(ValueError, match="v5 kind weights"):
        v5_pick(KINDS, 10, weights, 0)


def test_parse_names_the_flag_in_its_error():
    assert parse_weights("motion=4, digit=2", "--v5-kind-weights") == {"motion": 4.0, "digit": 2.0}
    with pytest.raises(ValueError, match="--v5-kind-weights"):
        parse_weights("motion", "--v5-kind-weights")
