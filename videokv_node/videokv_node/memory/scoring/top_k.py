"""The one top-k of the memory: exact partial sorts, the first k of a full sort's answer, in O(n) when k is small (issue 16).

Every selection that keeps "the k best" reads one of these (ReKV's retrieval on the index and
its list form, SelectKV, MuKV's rerank, TGV-KV's ranking, ReKV's re-reading), so a tie rule
is written once:

- ``top_k_stable``: best first, equal scores to the lower index (a stable descending sort).
- ``top_k_newest``: ascending indices, equal scores at the cut to the higher index.
- ``top_k_masked``: among a mask, any order, equal scores at the cut to the higher ``tie`` value
  (the block index: the higher block id, the newer block, whatever slot it sits in).
- ``top_values``: the k highest values, descending.

A question scores every block held (thousands to tens of thousands) but keeps a handful, so
sorting all the scores to read the first k is O(n log n) work for nothing. Each function
here returns exactly what the named full sort returns, ties included: ``torch.topk`` finds
the k-th value (the cut), every score above the cut is taken, and the ties at the cut are
taken by the sort's own tie rule; only those k are then sorted. A NaN score, or k close to
n, falls back to the full sort itself (the same answer by definition).

Tests: tests/unit/test_top_k.py checks each against its full sort on random and tied inputs,
tests/unit/test_block_index.py ``top_k_masked`` against a brute-force reference.
"""

from __future__ import annotations

import torch

_SORT_BELOW = 4  # k * 4 >= n: the full sort is as cheap as the cut and certainly the same


def _full_sort_decides(scores: torch.Tensor, k: int) -> bool:
    """k close to n (or 0), or a NaN (``topk`` and ``sort`` need not agree on where it goes)."""
    return k * _SORT_BELOW >= scores.numel() or k == 0 or bool(torch.isnan(scores).any())


def _cut_parts(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(indices above the k-th highest value, ascending; indices equal to it, ascending), or None where
    the full sort must decide (``_full_sort_decides``). ``k`` already clamped to [0, n]."""
    if _full_sort_decides(scores, k):
        return None
    cut = torch.topk(scores, k).values[-1]
    return (scores > cut).nonzero().flatten(), (scores == cut).nonzero().flatten()


def top_k_stable(scores: torch.Tensor, k: int) -> torch.Tensor:
    """``torch.sort(scores, descending=True, stable=True).indices[:k]``: the k highest, best first,
    equal scores by lower index. scores: (n,) -> (min(k, n),) int64."""
    k = max(0, min(k, scores.numel()))
    parts = _cut_parts(scores, k)
    if parts is None:
        return torch.sort(scores, descending=True, stable=True).indices[:k]
    above, tied = parts
    picked = torch.sort(torch.cat([above, tied[: k - above.numel()]])).values  # (k,) ascending index
    # A stable sort of ascending indices keeps the lower index first among equal scores.
    return picked[torch.sort(scores[picked], descending=True, stable=True).indices]


def top_k_newest(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of the k highest scores, ascending, equal scores at the cut to the higher index:
    ``sort(n - 1 - sort(scores.flip(0), descending=True, stable=True).indices[:k])``.
    scores: (n,) -> (min(k, n),) int64."""
    n = scores.numel()
    k = max(0, min(k, n))
    parts = _cut_parts(scores, k)
    if parts is None:
        return torch.sort(n - 1 - torch.sort(scores.flip(0), descending=True, stable=True).indices[:k]).values
    above, tied = parts
    need = k - above.numel()
    return torch.sort(torch.cat([above, tied[tied.numel() - need :] if need else tied[:0]])).values


def top_values(scores: torch.Tensor, k: int) -> torch.Tensor:
    """``torch.sort(scores, descending=True).values[:k]``: the k highest values, descending (equal
    values are interchangeable, so the sequence is the sort's; scores without signed zeros, whose
    order the two need not share, such as a softmax). scores: (n,) -> (min(k, n),)."""
    k = max(0, min(k, scores.numel()))
    if _full_sort_decides(scores, k):
        return torch.sort(scores, descending=True).values[:k]
    return torch.topk(scores, k, sorted=True).values


def top_k_masked(scores: torch.Tensor, mask: torch.Tensor, tie: torch.Tensor, k: int) -> torch.Tensor:
    """(min(k, count),) indices of the ``k`` highest ``scores`` among ``mask``, in no set order; equal
    scores at the cut go to the higher ``tie`` (the block index passes block ids: the newer block).
    scores: (n,) float; mask: (n,) bool; tie: (n,) int64, distinct where ``mask``."""
    k = min(k, int(mask.sum()))
    if k == 0:
        return tie.new_zeros(0)
    vals = scores.masked_fill(~mask, float("-inf"))
    cut = torch.topk(vals, k).values[-1]
    above = (vals > cut) & mask
    ties = (vals == cut) & mask
    need = k - int(above.sum())
    tied = torch.topk(torch.where(ties, tie, torch.full_like(tie, -1)), need).indices
    return torch.cat([above.nonzero().flatten(), tied])
