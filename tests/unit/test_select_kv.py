"""StreamKV's layer-adaptive SelectKV: exact budgets on hand-made scores, against two references.

References, both written here in Python floats, independent of ``select_kv.py``: a brute
force that tries every distinct threshold p (each cumulative sum and each midpoint between
neighbours) and applies Eq. (7) by its definition, with its own softmax; and Algorithm 1
of the paper, the binary search on p, literally (``algorithm1``). Inputs are random cosine-like scores in [-1, 1],
where ties between cumulative sums have probability zero; ties get their own
tests, with the documented rule.
"""

from __future__ import annotations

import math
from itertools import accumulate

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit import references as ref
from videokv_node.memory.scoring.select_kv import (
    code_layer_budgets,
    cosine_scores,
    cumulative_scores,
    layer_budgets,
    rescale_counts,
    select_kv,
    standardise,
)

PEAKED = torch.tensor([1.0, -1.0, -1.0, -1.0])  # C = 0.711, 0.807, 0.904, 1
FLAT = torch.zeros(4)  # C = 0.25, 0.5, 0.75, 1
EMPTY = torch.zeros(0)


def t(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32)


# --- cosine_scores -----------------------------------------------------------
def test_cosine_scores_known_values():
    reps = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0], [-2.0, 0.0]])
    got = cosine_scores(reps, torch.tensor([3.0, 0.0]))
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, t(1.0, 0.0, 1 / math.sqrt(2), 0.0, -1.0))


def test_cosine_scores_zero_criterion_gives_zeros():
    assert torch.equal(cosine_scores(torch.randn(5, 3), torch.zeros(3)), torch.zeros(5))


def test_cosine_scores_match_torch():
    g = torch.Generator().manual_seed(0)
    reps, crit = torch.randn(7, 16, generator=g, dtype=torch.float64), torch.randn(16, generator=g, dtype=torch.float64)
    expected = torch.nn.functional.cosine_similarity(reps, crit[None], dim=1).float()
    torch.testing.assert_close(cosine_scores(reps, crit), expected)


@pytest.mark.parametrize("reps, crit", [(torch.zeros(3), torch.zeros(3)), (torch.zeros(2, 3), torch.zeros(4))])
def test_cosine_scores_rejects_bad_shapes(reps, crit):
    with pytest.raises(ValueError, match="cosine_scores"):
        cosine_scores(reps, crit)


# --- layer_budgets: exact small cases ----------------------------------------
@pytest.mark.parametrize(
    "total, expected",
    [
        (0, [0, 0]),
        (1, [1, 0]),  # below one per layer: the peaked layer's top (0.711) beats the flat one's (0.25)
        (2, [1, 1]),
        (3, [1, 2]),  # 0.25 (flat, k=1)
        (4, [1, 3]),  # 0.5 (flat, k=2)
        (5, [2, 3]),  # 0.711 (peaked, k=1)
        (6, [2, 4]),  # 0.75 (flat, k=3)
        (7, [3, 4]),  # 0.807 (peaked, k=2)
        (8, [4, 4]),
        (9, [4, 4]),  # more than there is: everything
    ],
)
def test_budgets_peaked_vs_flat(total, expected):
    """The flat layer needs more candidates to reach the same cumulative mass, so it gets more."""
    assert layer_budgets([PEAKED, FLAT], total) == expected


def test_empty_layers_get_nothing_and_do_not_count():
    assert layer_budgets([EMPTY, PEAKED, EMPTY, FLAT], 4) == [0, 1, 0, 3]
    assert layer_budgets([EMPTY, EMPTY], 3) == [0, 0]
    assert layer_budgets([], 3) == []


@pytest.mark.parametrize(
    "total, expected", [(0, [0, 0, 0, 0]), (1, [0, 1, 0, 0]), (2, [0, 1, 1, 0]), (3, [1, 1, 1, 0])]
)
def test_below_one_per_layer_goes_to_the_largest_tops(total, expected):
    """Our choice for N < L': layers ranked by C_l(1) = 0.25 (flat), 1 (single), 0.711 (peaked)."""
    assert layer_budgets([FLAT, t(0.3), PEAKED, EMPTY], total) == expected


def test_below_one_per_layer_ties_by_layer_index():
    assert layer_budgets([FLAT, PEAKED, FLAT, PEAKED], 1) == [0, 1, 0, 0]
    assert layer_budgets([FLAT, PEAKED, FLAT, PEAKED], 2) == [0, 1, 0, 1]
    assert layer_budgets([FLAT, PEAKED, FLAT, PEAKED], 3) == [1, 1, 0, 1]


@pytest.mark.parametrize("total, expected", [(2, [1, 1]), (3, [2, 1]), (4, [2, 2]), (5, [3, 2]), (6, [3, 3])])
def test_equal_cumulative_sums_go_to_the_earlier_layer(total, expected):
    """Two identical layers: C = 1/3, 2/3 in both. Odd budgets break the tie towards layer 0."""
    layers = [t(0.1, 0.1, 0.1), t(0.1, 0.1, 0.1)]
    assert layer_budgets(layers, total) == expected
    # Algorithm 1 has no answer exactly where the tie straddles the cut.
    assert (algorithm1(layers, total) is None) == (total in (3, 5))


def test_negative_total_raises():
    with pytest.raises(ValueError, match="total"):
        layer_budgets([FLAT], -1)


# --- layer_budgets against references -----------------------------------------
def reference_cumsums(scores: list[torch.Tensor]) -> list[list[float]]:
    """C_l(k) with a Python-float softmax: independent of the implementation's torch path."""
    out = []
    for s in scores:
        exps = [math.exp(v) for v in s.tolist()]
        z = sum(exps)
        out.append(list(accumulate(sorted((e / z for e in exps), reverse=True))))
    return out


def reference_budgets(scores: list[torch.Tensor], total: int) -> list[int]:
    """Try every distinct threshold p; Eq. (7) by its definition; the p with sum_l K_l^p == total."""
    cums = reference_cumsums(scores)
    values = sorted({c for layer in cums for c in layer})
    candidates = [values[0] / 2] + values + [(a + b) / 2 for a, b in zip(values, values[1:])] + [1.0]

    def k_at(c: list[float], p: float) -> int:
        return next((k for k, v in enumerate(c, start=1) if v >= p), len(c))

    for p in candidates:
        budgets = [k_at(c, p) for c in cums]
        if sum(budgets) == total:
            return budgets
    raise AssertionError(f"no threshold gives {total}")


def random_layers(g: torch.Generator) -> list[torch.Tensor]:
    n_layers = int(torch.randint(1, 7, (1,), generator=g))
    counts = torch.randint(0, 11, (n_layers,), generator=g).tolist()
    return [torch.rand(n, generator=g) * 2 - 1 for n in counts]


def random_cases(n_cases: int, seed: int):
    """(scores, total) with L' <= total <= sum n_l, the range where a threshold p exists."""
    g = torch.Generator().manual_seed(seed)
    cases = []
    while len(cases) < n_cases:
        layers = random_layers(g)
        n_nonempty, size = sum(s.numel() > 0 for s in layers), sum(s.numel() for s in layers)
        if size == 0:
            continue
        cases.append((layers, int(torch.randint(n_nonempty, size + 1, (1,), generator=g))))
    return cases


def test_matches_brute_force_threshold():
    for layers, total in random_cases(150, seed=1):
        assert layer_budgets(layers, total) == reference_budgets(layers, total), (layers, total)


def k_at_threshold(cums: list[list[float]], p: float) -> list[int]:
    """Eq. (7): K_l^p = min{k : C_l(k) >= p}; all n_l if rounding leaves C_l(n_l) below p; 0 if empty."""
    return [next((k for k, v in enumerate(c, start=1) if v >= p), len(c)) for c in cums]


def algorithm1(scores: list[torch.Tensor], total: int, eps: float = 1e-9) -> float | None:
    """Algorithm 1 of the paper, literally: bisect p in [0, 1] until sum_l K_l^p == total; None if the
    search ends without delta == 0 (total outside [L', sum n_l], or equal sums straddling the cut)."""
    cums = reference_cumsums(scores)
    p1, p2 = 0.0, 1.0
    while p2 - p1 > eps:
        p = (p1 + p2) / 2
        delta = sum(k_at_threshold(cums, p)) - total
        if delta == 0:
            return p
        if delta < 0:
            p1 = p
        else:
            p2 = p
    return None


def test_algorithm1_reference_hand_computed():
    """PEAKED's C = 0.711, 0.807, 0.904, 1 and FLAT's 0.25, 0.5, 0.75, 1: p in (0.711, 0.75] gives [2, 3]."""
    p = algorithm1([PEAKED, FLAT], 5)
    assert p is not None and 0.711 < p <= 0.75
    assert k_at_threshold(reference_cumsums([PEAKED, FLAT]), 0.72) == [2, 3]


def test_matches_binary_search():
    for layers, total in random_cases(150, seed=2):
        p = algorithm1(layers, total)
        assert p is not None, (layers, total)  # without ties, Algorithm 1 always converges here
        assert k_at_threshold(reference_cumsums(layers), p) == layer_budgets(layers, total)


def test_binary_search_fails_outside_its_range():
    assert algorithm1([PEAKED, FLAT], 9) is None  # more than there is
    assert algorithm1([PEAKED, FLAT], 1) is None  # below one per layer
    assert algorithm1([PEAKED, FLAT], 8) is not None


def test_cumulative_scores_end_at_one():
    for c in cumulative_scores([PEAKED, FLAT, t(0.5)]):
        assert c.dtype == torch.float64
        assert math.isclose(float(c[-1]), 1.0, rel_tol=1e-12)
        assert bool((c[1:] >= c[:-1]).all())


# --- layer_budgets: invariants --------------------------------------------------
layers_strategy = st.lists(
    st.lists(st.floats(-1.0, 1.0, width=32), max_size=8).map(lambda v: torch.tensor(v, dtype=torch.float32)),
    max_size=6,
)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(layers=layers_strategy)
def test_budget_invariants(layers):
    counts = [s.numel() for s in layers]
    n_nonempty = sum(n > 0 for n in counts)
    previous = [0] * len(layers)
    for total in range(sum(counts) + 2):
        budgets = layer_budgets(layers, total)
        assert sum(budgets) == min(total, sum(counts))
        assert all(0 <= k <= n for k, n in zip(budgets, counts))
        if total >= n_nonempty:
            assert all(k >= 1 for k, n in zip(budgets, counts) if n > 0)
        assert all(b >= a for a, b in zip(previous, budgets))  # never taken back as the budget grows
        previous = budgets


# --- select_kv -------------------------------------------------------------------
def test_select_kv_exact():
    scores = [t(0.1, 0.9, -0.5, 0.8), t(0.0, 0.0, 0.0, 0.0)]
    got = select_kv(scores, 5)  # C: 0.38, 0.73, 0.91, 1 vs 0.25, 0.5, 0.75, 1 -> K = [2, 3]
    assert layer_budgets(scores, 5) == [2, 3]
    assert [x.tolist() for x in got] == [[1, 3], [1, 2, 3]]  # layer 1 ties: the newest three
    assert all(x.dtype == torch.int64 for x in got)


def test_select_kv_ties_go_to_the_newer_candidate():
    scores = [t(0.5, 0.7, 0.5, 0.5, 0.2)]
    assert select_kv(scores, 1)[0].tolist() == [1]
    assert select_kv(scores, 2)[0].tolist() == [1, 3]
    assert select_kv(scores, 3)[0].tolist() == [1, 2, 3]


@settings(max_examples=80, deadline=None, derandomize=True)
@given(layers=layers_strategy, total=st.integers(0, 50))
def test_select_kv_keeps_the_top_scores_in_time_order(layers, total):
    picked = select_kv(layers, total)
    for s, idx, k in zip(layers, picked, layer_budgets(layers, total)):
        assert idx.numel() == k
        assert idx.tolist() == sorted(set(idx.tolist()))  # ascending, unique
        rest = torch.ones(s.numel(), dtype=torch.bool)
        rest[idx] = False
        if k and bool(rest.any()):
            assert float(s[idx].min()) >= float(s[rest].max())


# --- split code: StreamKV's code (standardised scores, rescaled counts) ---------------------------
def test_rescale_counts_hand_computed():
    # [2, 4, 6] onto [3, 5]: scaled 3, 4, 5 (sum 12 = the counts' sum), nothing to hand out.
    assert rescale_counts([2, 4, 6], 3, 5) == [3, 4, 5]
    # [1, 1, 10] onto [2, 6]: scaled 2, 2, 6, times 12/10 -> 2.4, 2.4, 7.2 -> 2, 2, 7 -> clipped 2, 2, 6 (sum 10);
    # the 2 short go to the smallest first: [3, 3, 6].
    assert rescale_counts([1, 1, 10], 2, 6) == [3, 3, 6]
    assert rescale_counts([4, 4], 1, 2) == [4, 4]  # equal counts: as they are (the code's early return)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(counts=st.lists(st.integers(1, 40), min_size=1, max_size=8), low=st.integers(1, 10), span=st.integers(0, 20))
def test_rescale_counts_equals_the_code(counts, low, span):
    assert rescale_counts(counts, low, low + span) == ref.rescale_sum_match(counts, low, low + span)


def test_code_split_standardises_before_the_softmax():
    # Scores of one layer scaled by 10 leave its z-scores, hence its budget, unchanged (not so for Eqs. 5-8).
    a, b = t(0.1, 0.2, 0.9, 0.3), t(0.5, 0.4, 0.45, 0.41)
    assert code_layer_budgets([a, b], 4, 1, 4) == code_layer_budgets([a * 10, b], 4, 1, 4)
    assert layer_budgets([a, b], 4) != layer_budgets([a * 10, b], 4)
    torch.testing.assert_close(standardise(t(1.0, 2.0, 3.0)), torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64))


def test_code_split_equals_the_reference():
    """Random layers of 0 or 3-10 candidates (z-scores of 1 or 2 candidates are constant: ties between
    layers, which the threshold reference cannot place), totals where a threshold exists."""
    g = torch.Generator().manual_seed(3)
    for _ in range(150):
        n_layers = int(torch.randint(1, 7, (1,), generator=g))
        counts = [0 if int(torch.randint(0, 4, (1,), generator=g)) == 0 else int(torch.randint(3, 11, (1,), generator=g)) for _ in range(n_layers)]
        layers = [torch.rand(n, generator=g) * 2 - 1 for n in counts]
        if not sum(counts):
            continue
        total = int(torch.randint(sum(n > 0 for n in counts), sum(counts) + 1, (1,), generator=g))
        low, high = int(torch.randint(1, 4, (1,), generator=g)), int(torch.randint(4, 9, (1,), generator=g))
        got = select_kv(layers, total, (low, high))
        assert [x.tolist() for x in got] == ref.selectkv_code([s.tolist() for s in layers], total, low, high), (layers, total)
