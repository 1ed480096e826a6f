"""Training-free passing blocks (paper section 3.3): which keys of a virtual block later blocks may see.

Per KV head, the block's keys are scored against the question's mean query
(mean over the question's tokens and the query heads of the group), the scores
are smoothed by a max-pool over neighbouring positions (so a selected token
brings its neighbours' chance along: video evidence spans adjacent patches),
and the top ``k`` positions are kept, in ascending order. The paper scores with
Q_query K^T and leaves pooling unspecified; the window is ``pool_window``.
The oracle and every rank call this same function on the same numbers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from videokv_node.spava.kernels import compute_dtype


def mean_question_query(question_q: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """(H_q, q, D) question queries -> (H_kv, D) mean over the group's heads and the question's tokens."""
    h_q, n, d = question_q.shape
    return question_q.to(compute_dtype(question_q.dtype)).reshape(n_kv_heads, h_q // n_kv_heads * n, d).mean(dim=1)


def select_passing(mean_q: torch.Tensor, block_k: torch.Tensor, k: int, pool_window: int) -> torch.Tensor:
    """Indices (H_kv, k) into the block, ascending per head, of the keys ``block_k`` (H_kv, n, D) to pass on."""
    h_kv, n, _ = block_k.shape
    if k > n:
        raise ValueError(f"cannot pass {k} of {n} keys")
    if k == n:  # everything passes: no scoring (the degenerate, exact case)
        return torch.arange(n, device=block_k.device).expand(h_kv, n)
    scores = torch.einsum("hd,hnd->hn", mean_q, block_k.to(mean_q.dtype))  # (H_kv, n)
    if pool_window > 1:
        scores = F.max_pool1d(scores[:, None], pool_window, stride=1, padding=pool_window // 2)[:, 0]
    # Max-pooling makes exact ties between neighbours; a stable sort breaks them by position,
    # so the choice never depends on the top-k algorithm's internals.
    top = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]  # (H_kv, k)
    return torch.sort(top, dim=-1).values
