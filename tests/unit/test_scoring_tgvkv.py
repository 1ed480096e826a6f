"""TGV-KV scoring math: text-vision layer budgets, text-weighted ranking, text-prioritised retention."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from videokv_node.memory.scoring import tgvkv

FAST = settings(max_examples=60, deadline=None, derandomize=True)
BIG = 10**6


# --- TVB: layer budgets -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("mass", "total", "caps", "floor", "expected"),
    [
        ([1, 1, 2], 8, [BIG] * 3, [0] * 3, [2, 2, 4]),  # exact proportions
        ([1, 1, 1], 10, [BIG] * 3, [0] * 3, [4, 3, 3]),  # largest remainder, tie -> lower layer
        ([1, 2, 3], 10, [BIG] * 3, [0] * 3, [2, 3, 5]),  # 1.67, 3.33, 5: fractions .67 > .33
        ([1, 1, 2], 8, [10, 10, 3], [0] * 3, [3, 2, 3]),  # cap 3; the 5 left split 2.5/2.5
        ([0, 1, 1], 6, [BIG] * 3, [2, 0, 0], [2, 2, 2]),  # zero mass lifted to its floor
        ([1, 2, 3, 0], 20, [3, 100, 100, 5], [0, 0, 0, 2], [3, 6, 9, 2]),
        ([5, 1], 100, [4, 7], [0, 0], [4, 7]),  # total over the caps: every layer at its cap
        ([0, 0, 0], 7, [BIG] * 3, [0] * 3, [3, 2, 2]),  # no mass at all: uniform
        ([3, 0], 10, [4, BIG], [0, 0], [4, 6]),  # massive layer capped: the zero-mass one takes the rest
        ([1, 1], 0, [5, 5], [0, 0], [0, 0]),
    ],
)
def test_tv_budgets_hand_computed(mass, total, caps, floor, expected):
    assert tgvkv.tv_budgets(torch.tensor(mass, dtype=torch.float32), total, caps, floor) == expected


def test_tv_budgets_reject_impossible_bounds():
    with pytest.raises(ValueError):
        tgvkv.tv_budgets(torch.ones(2), 3, [5, 5], [2, 2])  # floors 4 > 3
    with pytest.raises(ValueError):
        tgvkv.tv_budgets(torch.ones(2), 3, [1, 5], [2, 0])  # floor above cap
    with pytest.raises(ValueError):
        tgvkv.tv_budgets(torch.tensor([1.0, -1.0]), 3, [5, 5], [0, 0])
    with pytest.raises(ValueError):
        tgvkv.tv_budgets(torch.ones(3), 3, [5, 5], [0, 0])


def _reference_shares(mass, target, lo, hi):
    """clamp(t * m, lo, hi) summing to target, by bisection on t; zero-mass layers share uniformly the rest."""

    def fill(weights, layers, rest):
        def total(t):
            return sum(min(hi[i], max(lo[i], t * weights[i])) for i in layers)

        a, b = 0.0, 1.0
        while total(b) < rest and b < 1e18:
            b *= 2
        for _ in range(200):
            mid = (a + b) / 2
            a, b = (mid, b) if total(mid) < rest else (a, mid)
        return {i: min(hi[i], max(lo[i], b * weights[i])) for i in layers}

    layers = range(len(mass))
    massive = [i for i in layers if mass[i] > 0]
    zero = [i for i in layers if mass[i] == 0]
    if sum(hi[i] for i in massive) + sum(lo[i] for i in zero) >= target and massive:
        shares = fill(mass, massive, target - sum(lo[i] for i in zero))
        shares.update({i: float(lo[i]) for i in zero})
    else:  # every massive layer at its cap; the zero-mass layers share what is left evenly
        shares = {i: float(hi[i]) for i in massive}
        shares.update(fill([1.0] * len(mass), zero, target - sum(hi[i] for i in massive)))
    return [shares[i] for i in layers]


@st.composite
def budget_case(draw):
    n = draw(st.integers(1, 8))
    mass = [draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.7, 10.0])) for _ in range(n)]
    caps = [draw(st.integers(0, 50)) for _ in range(n)]
    floor = [draw(st.integers(0, c)) for c in caps]
    total = draw(st.integers(0, 300))
    return mass, total, caps, floor


@FAST
@given(budget_case())
def test_tv_budgets_sum_exactly_respect_bounds_and_track_the_shares(case):
    mass, total, caps, floor = case
    target = min(total, sum(caps))
    if sum(floor) > target:
        with pytest.raises(ValueError):
            tgvkv.tv_budgets(torch.tensor(mass), total, caps, floor)
        return
    got = tgvkv.tv_budgets(torch.tensor(mass, dtype=torch.float64), total, caps, floor)
    assert sum(got) == target
    assert all(f <= b <= c for f, b, c in zip(floor, got, caps))
    for b, share in zip(got, _reference_shares(mass, target, floor, caps)):
        assert abs(b - share) < 1 + 1e-6


@FAST
@given(st.lists(st.sampled_from([0.5, 1.0, 2.0, 4.0]), min_size=1, max_size=8), st.integers(0, 500))
def test_tv_budgets_without_bounds_are_proportional(mass, total):
    assume(sum(mass) > 0)
    n = len(mass)
    got = tgvkv.tv_budgets(torch.tensor(mass), total, [BIG] * n, [0] * n)
    assert sum(got) == total
    for b, m in zip(got, mass):
        assert abs(b - total * m / sum(mass)) < 1


# --- TWR: text-weighted ranking ---------------------------------------------------------


def test_text_weighted_scores_hand_computed():
    # Text columns: prompt p0, question q0, q1; rows are q0, q1.
    a_tt = torch.tensor([[0.5, 0.5, 0.9], [0.2, 0.3, 0.5]])  # 0.9: q0 cannot see q1, ignored
    a_tv = torch.tensor([[0.1, 0.3], [0.4, 0.2]])
    row_of_text_col = torch.tensor([0, 0, 1])
    col_of_row = torch.tensor([1, 2])
    s_text, s_vis = tgvkv.text_weighted_scores(a_tt, a_tv, row_of_text_col, col_of_row)
    torch.testing.assert_close(s_text, torch.tensor([0.7, 0.8, 0.5]))
    # w = [0.7/2, 0.8/2, 0.5/1] = [0.35, 0.4, 0.5] -> w~ = [0.28, 0.32, 0.4];
    # row q0 weighs w~[1] = 0.32, row q1 w~[2] = 0.4.
    torch.testing.assert_close(s_vis, torch.tensor([0.32 * 0.1 + 0.4 * 0.4, 0.32 * 0.3 + 0.4 * 0.2]))


def test_text_weighted_scores_reject_bad_maps():
    a_tt, a_tv = torch.ones(2, 3), torch.ones(2, 4)
    with pytest.raises(ValueError):
        tgvkv.text_weighted_scores(a_tt, a_tv, torch.tensor([0, 0, 2]), torch.tensor([1, 2]))
    with pytest.raises(ValueError):
        tgvkv.text_weighted_scores(a_tt, a_tv, torch.tensor([0, 0, 1]), torch.tensor([1, 3]))
    with pytest.raises(ValueError):
        tgvkv.text_weighted_scores(a_tt, torch.ones(3, 4), torch.tensor([0, 0, 1]), torch.tensor([1, 2]))


@FAST
@given(st.integers(0, 4), st.integers(1, 5), st.integers(0, 6), st.integers(0, 10**6))
def test_text_weighted_scores_match_a_loop_reference(n_prompt, n_question, n_vis, seed):
    g = torch.Generator().manual_seed(seed)
    nt, nq = n_prompt + n_question, n_question
    # Causal rows: question token i (text column n_prompt + i) sees the prompt and q_0..q_i.
    row_of_text_col = torch.tensor([0] * n_prompt + list(range(n_question)))
    col_of_row = torch.arange(n_prompt, nt)
    a = torch.rand(nq, nt + n_vis, generator=g, dtype=torch.float64)
    a_tt, a_tv = a[:, :nt], a[:, nt:]
    s_text, s_vis = tgvkv.text_weighted_scores(a_tt, a_tv, row_of_text_col, col_of_row)
    first = row_of_text_col.tolist()
    ref_text = [sum(float(a_tt[i, j]) for i in range(first[j], nq)) for j in range(nt)]
    w = [ref_text[j] / (nq - first[j]) for j in range(nt)]
    w = [x / sum(w) for x in w]
    ref_vis = [sum(w[int(col_of_row[i])] * float(a_tv[i, j]) for i in range(nq)) for j in range(n_vis)]
    torch.testing.assert_close(s_text, torch.tensor(ref_text, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(s_vis, torch.tensor(ref_vis, dtype=torch.float64).reshape(n_vis), rtol=0, atol=1e-12)


# --- TPR: text-prioritised retention ----------------------------------------------------


TEXT_IDX = torch.tensor([0, 1, 5])
VIS_IDX = torch.tensor([2, 3, 4, 6])
S_TEXT = torch.tensor([0.5, 0.1, 0.9])
S_VIS = torch.tensor([0.1, 0.4, 0.3, 0.2])


@pytest.mark.parametrize(
    ("budget", "kept"),
    [
        (100, [0, 1, 2, 3, 4, 5, 6]),
        (5, [0, 1, 3, 4, 5]),  # all text + the two best vision (3: 0.4, 4: 0.3)
        (4, [0, 1, 3, 5]),
        (3, [0, 1, 5]),  # budget == text: all text, no vision
        (2, [0, 5]),  # top text by s_text: 5 (0.9), 0 (0.5)
        (0, []),
    ],
)
def test_text_prioritised_keep_hand_computed(budget, kept):
    assert tgvkv.text_prioritised_keep(budget, TEXT_IDX, VIS_IDX, S_TEXT, S_VIS).tolist() == kept


@FAST
@given(st.integers(0, 8), st.integers(0, 8), st.integers(0, 20), st.integers(0, 10**6))
def test_text_prioritised_keep_properties(n_text, n_vis, budget, seed):
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n_text + n_vis, generator=g)
    text_idx, vis_idx = perm[:n_text], perm[n_text:]
    s_text = torch.randint(0, 3, (n_text,), generator=g).float()
    s_vis = torch.randint(0, 3, (n_vis,), generator=g).float()
    kept = tgvkv.text_prioritised_keep(budget, text_idx, vis_idx, s_text, s_vis)
    assert kept.numel() == min(budget, n_text + n_vis)
    assert bool((kept[1:] > kept[:-1]).all())
    kept_set = set(kept.tolist())
    text_kept = kept_set & set(text_idx.tolist())
    if budget >= n_text:
        assert text_kept == set(text_idx.tolist())
    else:
        assert kept_set == text_kept  # no vision while text is short of budget
    for idx, s, chosen in ((text_idx, s_text, text_kept), (vis_idx, s_vis, kept_set - text_kept)):
        dropped = [i for i in range(idx.numel()) if int(idx[i]) not in chosen]
        taken = [i for i in range(idx.numel()) if int(idx[i]) in chosen]
        if dropped and taken:
            assert float(s[taken].min()) >= float(s[dropped].max())
