"""ReKV's retrieval arithmetic (Di et al., ICLR 2025), pure torch: block scores and fused ranks.

ReKV scores a block for a question by the dot product of the question's mean query with the
block's mean key, per layer, scaled as attention scales its logits: mean over the KV heads of
q_h . k_h / sqrt(D). Queries are pre-RoPE and averaged over the question's tokens, then over
the query heads of each KV group (GQA: ``scoring/queries.py``); keys are the block's mean pre-RoPE key
(``FrameBlock.key_mean``), so a score does not depend on where a block was encoded.

Who calls what: the engine's in-pass retrieval (``context/question_cache.py``) ranks one layer's
candidates on the block index (``BlockIndex.top_k``: ``block_scores``); ``selection: shared`` fuses
the layers' rankings (``BlockIndex.fused_top_k``: ``fused_ranks``, ours, policies/rekv.py says why);
``~/locate`` averages ``layer_scores`` over the layers (memory/questions/locate.py). The one top-k:
``scoring/top_k.py``.
"""

from __future__ import annotations

import torch

from videokv_node.memory.scoring.top_k import top_k_stable


def layer_scores(q_means: torch.Tensor, key_means: torch.Tensor) -> torch.Tensor:
    """ReKV's block score in every layer: (L, H_kv, D) query means, (N, L, H_kv, D) block key means
    -> (N, L), score = mean over KV heads of q_h . k_h / sqrt(D)."""
    H, D = key_means.shape[2], key_means.shape[3]
    return torch.einsum("lhd,nlhd->nl", q_means.float(), key_means.float()) / (H * D ** 0.5)


def block_scores(query_mean: torch.Tensor, key_means: torch.Tensor) -> torch.Tensor:
    """One layer's ``layer_scores``: (H, D) query mean, (N, H, D) key means -> (N,).

    One matrix-vector product, (N, H * D) @ (H * D,): the block index scores every slot at once
    this way (einsum over (N, H, D) was 100x slower at 16k slots)."""
    return (key_means.reshape(key_means.shape[0], -1) @ query_mean.to(key_means).reshape(-1)) / (
        key_means.shape[1] * key_means.shape[2] ** 0.5)


def top_k_blocks(query_mean: torch.Tensor, key_means: torch.Tensor, k: int) -> list[int]:
    """Indices of the ``k`` best of N blocks for one layer, best first, equal scores the newer (higher
    index) first: ReKV's per-layer retrieval on a list. query_mean: (H_kv, D); key_means: (N, H_kv, D)."""
    scores = block_scores(query_mean, key_means)  # (N,)
    n = scores.numel()
    return (n - 1 - top_k_stable(scores.flip(0), k)).tolist()  # a stable sort of the reversed order: ties to the newer


def fused_ranks(scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """(n,) float64 mean over layers of 1 / (1 + rank), from (L, n) per-layer scores of n blocks
    with ids ``ids``: rank 0 is a layer's highest score, equal scores rank the newer (higher id)
    block first, -inf (a layer the block does not keep) ranks after every finite score."""
    L, n = scores.shape
    # Sort by id descending, then stably by score descending: equal scores keep the newer first.
    by_id = torch.argsort(ids, descending=True)
    order = by_id[torch.sort(scores[:, by_id], dim=1, descending=True, stable=True).indices]  # (L, n)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(n, device=order.device).expand(L, n))
    return (1.0 / (1.0 + rank.double())).mean(0)
