"""Attention that also returns its log-sum-exp: the one primitive Spava's partial results are built from.

Plain tensor code (no flash kernel): the CPU tests need float64 and the
oracle must use the very same arithmetic. Grouped-query attention is done by
viewing the queries as (H_kv, groups, n, D), never by copying keys.
"""

from __future__ import annotations

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32, or the input's dtype when wider: softmax statistics never run in half precision."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def causal_mask(n: int, m: int, device: torch.device) -> torch.Tensor:
    """(n, m) boolean mask: row i sees keys j <= m - n + i (the last n keys are the rows' own, causal)."""
    i = torch.arange(n, device=device)[:, None]
    j = torch.arange(m, device=device)[None, :]
    return j <= (m - n) + i


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention of ``q`` (H_q, n, D) over ``k``, ``v`` (H_kv, m, D).

    ``mask`` is boolean, True = visible, shaped (n, m) or (H_kv, n, m).
    Returns ``out`` (H_q, n, D) and ``lse`` (H_q, n) in ``compute_dtype``.
    A row that sees no key (m == 0, or all masked) has lse = -inf and out = 0,
    which is exactly what the log-sum-exp merge gives zero weight.
    """
    h_q, n, d = q.shape
    h_kv, m, _ = k.shape
    dt = compute_dtype(q.dtype)
    g = h_q // h_kv
    if m == 0:
        return q.new_zeros((h_q, n, v.shape[-1]), dtype=dt), q.new_full((h_q, n), float("-inf"), dtype=dt)
    qg = q.to(dt).reshape(h_kv, g, n, d)  # (H_kv, g, n, D)
    logits = torch.einsum("hgnd,hmd->hgnm", qg, k.to(dt)) * scale  # (H_kv, g, n, m)
    if mask is not None:
        mask = mask[:, None] if mask.dim() == 3 else mask  # (H_kv, 1, n, m) or (n, m)
        logits = logits.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)  # (H_kv, g, n)
    seen = torch.isfinite(lse)
    probs = torch.exp(logits - torch.where(seen, lse, 0.0)[..., None])  # masked keys: exp(-inf) = 0
    out = torch.einsum("hgnm,hmd->hgnd", probs, v.to(dt))  # (H_kv, g, n, D)
    return out.reshape(h_q, n, -1), lse.reshape(h_q, n)
