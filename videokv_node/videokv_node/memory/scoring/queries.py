"""A text's mean query per KV head: what every retrieving policy scores its blocks against.

ReKV's question query (per layer, in the pass or from a probe), StreamKV's criterion c (guidance
prompt or question, heads concatenated, Eq. 3) and MuKV's question vector (the last layer's, heads
concatenated) are all this: the pre-RoPE queries averaged over the text's tokens, then over the
query heads that share each KV head (GQA), so that they meet the blocks' mean keys head by head.
"""

from __future__ import annotations

import torch


def query_means(queries: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """(..., n, H_q, D) queries -> (..., H_kv, D) float32: mean over the n tokens, then over the
    H_q / H_kv query heads of each KV group. (L, n, H_q, D), a probe's, gives each layer's."""
    *lead, _, H_q, D = queries.shape
    return queries.float().mean(-3).view(*lead, n_kv_heads, H_q // n_kv_heads, D).mean(-2)
