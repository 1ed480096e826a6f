"""The log-sum-exp merge and the passing-block selection, on known numbers and as properties."""

from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from videokv_node.spava.kernels import attend
from videokv_node.spava.merge import merge_all, merge_pair
from videokv_node.spava.selection import mean_question_query, select_passing


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 40),
    n_cuts=st.integers(0, 6),
    seed=st.integers(0, 2**31 - 1),
    empty_parts=st.integers(0, 3),
)
def test_any_split_merged_in_any_order_equals_one_softmax(m, n_cuts, seed, empty_parts):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(4, 3, 8, generator=g, dtype=torch.float64) * 3  # (H_q, n, D): 2 KV groups
    k = torch.randn(2, m, 8, generator=g, dtype=torch.float64) * 3
    v = torch.randn(2, m, 8, generator=g, dtype=torch.float64)
    ref_out, ref_lse = attend(q, k, v, 0.35)
    perm = torch.randperm(m, generator=g)  # keys need not be contiguous in a partition
    cuts = sorted(torch.randint(0, m + 1, (n_cuts,), generator=g).tolist())
    bounds = [0, *cuts, m]
    parts = [attend(q, k[:, perm[s:e]], v[:, perm[s:e]], 0.35) for s, e in zip(bounds, bounds[1:])]
    parts += [attend(q, k[:, :0], v[:, :0], 0.35) for _ in range(empty_parts)]  # lse = -inf
    order = torch.randperm(len(parts), generator=g).tolist()
    out, lse = merge_all(parts[i] for i in order)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=0, atol=1e-12)


def test_float32_inputs_merge_in_float32_without_overflow():
    q = torch.full((1, 1, 4), 30.0)
    k = torch.full((1, 6, 4), 30.0)  # logits of 3600: exp overflows unless shifted
    v = torch.arange(24.0).view(1, 6, 4)
    out, lse = merge_pair(*attend(q, k[:, :2], v[:, :2], 1.0), *attend(q, k[:, 2:], v[:, 2:], 1.0))
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    # lse ~ 3600 in float32 has a spacing of 2.4e-4: that, not the merge, bounds the error
    torch.testing.assert_close(out[0, 0], v[0].mean(0), rtol=1e-4, atol=1e-3)


def test_two_empty_partials_give_zero_output_and_minus_infinity_not_nan():
    empty = attend(torch.ones(2, 3, 4), torch.ones(1, 0, 4), torch.ones(1, 0, 4), 1.0)
    out, lse = merge_pair(*empty, *empty)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


def test_a_fully_masked_row_counts_as_an_empty_partition():
    q, k, v = torch.randn(1, 2, 4), torch.randn(1, 3, 4), torch.randn(1, 3, 4)
    mask = torch.tensor([[False, False, False], [True, True, True]])
    out, lse = attend(q, k, v, 1.0, mask)
    assert torch.isneginf(lse[0, 0]) and torch.equal(out[0, 0], torch.zeros(4))
    merged, _ = merge_pair(out, lse, *attend(q, k, v, 1.0))
    torch.testing.assert_close(merged[0, 0], attend(q, k, v, 1.0)[0][0, 0])


def test_selection_takes_the_top_smoothed_scores_per_kv_head():
    k = torch.zeros(2, 10, 2, dtype=torch.float64)
    k[0, 5, 0] = 1.0  # head 0: one strong key; pooling over 3 lifts its neighbours to the same score
    k[1, :, 1] = torch.arange(10.0)  # head 1: scores grow with position
    mean_q = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    assert select_passing(mean_q, k, 3, pool_window=3).tolist() == [[4, 5, 6], [7, 8, 9]]
    assert select_passing(mean_q, k, 1, pool_window=1).tolist() == [[5], [9]]
    assert select_passing(mean_q, k, 10, pool_window=3).tolist() == [list(range(10))] * 2


def test_mean_query_averages_the_group_and_the_question_tokens():
    q = torch.arange(4 * 2 * 1, dtype=torch.float64).view(4, 2, 1)  # (H_q=4, q=2, D=1), 2 KV heads
    assert mean_question_query(q, 2).flatten().tolist() == [1.5, 5.5]
