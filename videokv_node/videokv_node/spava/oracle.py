"""The exact single-process reference of Spava's prefill: dense attention under the structured mask.

Row classes (global order [anchor | 2W virtual blocks | question]):
- anchor rows see the anchor causally;
- rows of virtual block v see the whole anchor, the passing keys of every
  earlier virtual block u < v (per KV head, ``selection.select_passing``) and
  block v causally;
- question rows see everything before them and the question causally.
The distributed attention (``shard.py``) must equal this to rounding.
"""

from __future__ import annotations

import torch

from videokv_node.spava.kernels import attend
from videokv_node.spava.layout import Layout
from videokv_node.spava.selection import mean_question_query, select_passing


def structured_mask(layout: Layout, q: torch.Tensor, k: torch.Tensor, pool_window: int) -> torch.Tensor:
    """(H_kv, T, T) boolean visibility of one layer, from its full-sequence queries (H_q, T, D) and keys (H_kv, T, D)."""
    h_kv, t, _ = k.shape
    dev = k.device
    causal = torch.ones(t, t, dtype=torch.bool, device=dev).tril()
    mask = torch.zeros(h_kv, t, t, dtype=torch.bool, device=dev)
    a = layout.anchor_len
    mask[:, :a, :a] = causal[:a, :a]
    mean_q = mean_question_query(q[:, layout.question_start:], h_kv)
    passed = torch.zeros(h_kv, t, dtype=torch.bool, device=dev)  # keys passed on by the blocks seen so far
    for v in range(layout.n_virtual):
        s, e = layout.block_bounds(v)
        mask[:, s:e, :a] = True
        mask[:, s:e] |= passed[:, None, :]
        mask[:, s:e, s:e] = causal[: e - s, : e - s]
        picked = select_passing(mean_q, k[:, s:e], layout.passing_of(v), pool_window)  # (H_kv, p)
        passed.scatter_(1, picked + s, True)
    qs = layout.question_start
    mask[:, qs:] = causal[qs:]
    return mask


def oracle_attention(layout: Layout, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, pool_window: int) -> torch.Tensor:
    """(H_q, T, D) attention output of one layer of the whole sequence under ``structured_mask``."""
    out, _ = attend(q, k, v, scale, structured_mask(layout, q, k, pool_window))
    return out
