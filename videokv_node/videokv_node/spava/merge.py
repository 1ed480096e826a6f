"""The log-sum-exp merge of partial attention results (paper eq. 5, FlashAttention's online softmax).

If partition i of the keys gives ``out_i`` (softmax-normalised over its keys)
and ``lse_i`` (log of its softmax denominator), then attention over all keys is
``lse = logsumexp_i(lse_i)`` and ``out = sum_i exp(lse_i - lse) * out_i``.
Computed pairwise with ``logaddexp`` in float32 (float64 when given float64) so no
exponent ever overflows; an empty partition (lse = -inf) gets weight 0 explicitly,
because exp(-inf - -inf) would be NaN when every partition is empty.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from videokv_node.spava.kernels import compute_dtype


def _weight(lse_i: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """exp(lse_i - lse), 0 where lse_i is -inf (empty partition or a row that saw nothing)."""
    empty = torch.isneginf(lse_i)
    return torch.where(empty, 0.0, torch.exp(torch.where(empty, 0.0, lse_i - lse)))


def merge_pair(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partials: out (H, n, D), lse (H, n) each; returns the merged (out, lse)."""
    dt = compute_dtype(torch.promote_types(out_a.dtype, out_b.dtype))
    lse_a, lse_b = lse_a.to(dt), lse_b.to(dt)
    lse = torch.logaddexp(lse_a, lse_b)  # -inf only where both are empty
    out = _weight(lse_a, lse)[..., None] * out_a.to(dt) + _weight(lse_b, lse)[..., None] * out_b.to(dt)
    return out, lse


def merge_all(parts: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold ``merge_pair`` over (out, lse) partials in the given order (at least one)."""
    it = iter(parts)
    try:
        out, lse = next(it)
    except StopIteration:
        raise ValueError("merge_all needs at least one partial result") from None
    dt = compute_dtype(out.dtype)
    out, lse = out.to(dt), lse.to(dt)
    for out_i, lse_i in it:
        out, lse = merge_pair(out, lse, out_i, lse_i)
    return out, lse
