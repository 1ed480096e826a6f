"""Exact partial sorts (memory/scoring/top_k.py) and the SelectKV that uses them (issue 16).

Each partial sort must return, bit for bit, the full sort it replaces: the references below are
those sorts written out here. Few distinct values force ties at the cut; long inputs with small k
take the partial path (short ones the sort itself). SelectKV's budgets and picks are checked
against SelectKV written with full sorts of every layer (the implementation before issue 16).
"""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from videokv_node.memory.scoring.select_kv import layer_budgets, select_kv
from videokv_node.memory.scoring.top_k import top_k_newest, top_k_stable, top_values


def scores_from(levels: list[int], scale: float) -> torch.Tensor:
    return torch.tensor([scale * v for v in levels], dtype=torch.float32)


score_lists = st.lists(st.integers(-3, 3), min_size=0, max_size=200)


@settings(max_examples=150, deadline=None)
@given(levels=score_lists, k=st.integers(0, 30), scale=st.sampled_from([1.0, 0.1, 1e-3]))
def test_top_k_stable_is_the_stable_sorts_first_k(levels, k, scale):
    s = scores_from(levels, scale)
    expected = torch.sort(s, descending=True, stable=True).indices[:k]
    assert torch.equal(top_k_stable(s, k), expected)


@settings(max_examples=150, deadline=None)
@given(levels=score_lists, k=st.integers(0, 30), scale=st.sampled_from([1.0, 0.1, 1e-3]))
def test_top_k_newest_is_the_reversed_stable_sorts_first_k(levels, k, scale):
    s = scores_from(levels, scale)
    order = torch.sort(s.flip(0), descending=True, stable=True).indices[:k]
    expected = torch.sort(s.numel() - 1 - order).values
    assert torch.equal(top_k_newest(s, k), expected)


@settings(max_examples=100, deadline=None)
@given(n=st.integers(1, 400), k=st.integers(0, 40), seed=st.integers(0, 10_000))
def test_top_values_are_the_sorts_first_values(n, k, seed):
    g = torch.Generator().manual_seed(seed)
    s = torch.softmax(torch.randn(n, generator=g, dtype=torch.float64).round(decimals=1), dim=0)  # ties
    assert torch.equal(top_values(s, k), torch.sort(s, descending=True).values[:k])


def test_a_nan_falls_back_to_the_sort():
    s = torch.tensor([0.5] * 40 + [float("nan")] + [0.7] * 40)
    assert torch.equal(top_k_stable(s, 3), torch.sort(s, descending=True, stable=True).indices[:3])
    order = torch.sort(s.flip(0), descending=True, stable=True).indices[:3]
    assert torch.equal(top_k_newest(s, 3), torch.sort(s.numel() - 1 - order).values)


def test_ties_at_the_cut_take_the_rule_of_each_sort():
    s = torch.tensor([1.0] * 30 + [2.0] + [1.0] * 30)  # one best, then 60 equal
    assert top_k_stable(s, 3).tolist() == [30, 0, 1]  # equal: lower index first
    assert top_k_newest(s, 3).tolist() == [30, 59, 60]  # equal: the newest


# --- SelectKV with every layer fully sorted: the implementation before issue 16 -------------
def reference_budgets(scores: list[torch.Tensor], total: int) -> list[int]:
    cums = []
    for s in scores:
        s = s.reshape(-1).to(torch.float64)
        cums.append(torch.cumsum(torch.sort(torch.softmax(s, 0), descending=True).values, 0) if s.numel() else s)
    counts = [c.numel() for c in cums]
    if total >= sum(counts):
        return counts
    nonempty = [l for l, n in enumerate(counts) if n]
    budgets = [0] * len(counts)
    if total <= len(nonempty):
        tops = torch.stack([cums[l][0] for l in nonempty])
        for i in torch.sort(tops, descending=True, stable=True).indices[:total].tolist():
            budgets[nonempty[i]] = 1
        return budgets
    for l in nonempty:
        budgets[l] = 1
    values = torch.cat([c[:-1] for c in cums])
    owners = torch.cat([torch.full((c.numel() - 1,), l, dtype=torch.int64) for l, c in enumerate(cums) if c.numel()])
    taken = owners[torch.sort(values, stable=True).indices[: total - len(nonempty)]]
    extra = torch.bincount(taken, minlength=len(counts)).tolist()
    return [b + e for b, e in zip(budgets, extra)]


def reference_select(scores: list[torch.Tensor], total: int) -> list[list[int]]:
    out = []
    for s, k in zip(scores, reference_budgets(scores, total)):
        order = torch.sort(s.flip(0), descending=True, stable=True).indices[:k]
        out.append(torch.sort(s.numel() - 1 - order).values.tolist())
    return out


@settings(max_examples=120, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 300), min_size=1, max_size=4),
    total=st.integers(0, 40),
    levels=st.integers(1, 6),
    seed=st.integers(0, 10_000),
    copy_layer=st.booleans(),
)
def test_select_kv_equals_selectkv_with_full_sorts(sizes, total, levels, seed, copy_layer):
    """Few score levels make equal cumulative sums inside and across layers (a copied layer: bit-equal ones)."""
    g = torch.Generator().manual_seed(seed)
    scores = [torch.randint(0, levels, (n,), generator=g).float() / levels for n in sizes]
    if copy_layer and len(scores) > 1:
        scores[1] = scores[0].clone()
    assert layer_budgets(scores, total) == reference_budgets(scores, total)
    assert [c.tolist() for c in select_kv(scores, total)] == reference_select(scores, total)


def test_select_kv_over_many_candidates_takes_the_partial_path_and_agrees():
    g = torch.Generator().manual_seed(3)
    scores = [torch.nn.functional.normalize(torch.randn(7000, generator=g), dim=0) * math.sqrt(7000) / 30 for _ in range(2)]
    total = 16
    assert layer_budgets(scores, total) == reference_budgets(scores, total)
    assert [c.tolist() for c in select_kv(scores, total)] == reference_select(scores, total)
