"""An attention observer for ``~/locate``'s first ranking when the policy has no retrieval score of its own:
per layer, the mass each context key gets from the query's tokens (``memory/questions/locate.py``).

It takes the question stage's place in a question's prefill (``QuestionReader.prefill`` calls ``observer()``
and ``evict()``), observing only: nothing is evicted, the prefill's cache is dropped right after.
"""

from __future__ import annotations

import torch

from videokv_node.models.attention import attention_probs


class AttentionMass:
    """An attention observer: per layer, the mass each context key gets from the query's tokens,
    averaged over those tokens and the query heads ((K_ctx,) float32 on the host)."""

    def __init__(self) -> None:
        self.per_layer: dict[int, torch.Tensor] = {}

    def __call__(self, layer: int, query: torch.Tensor, key: torch.Tensor, scale: float) -> None:
        probs = attention_probs(query, key, scale)  # (H_q, q, K): the q query tokens come last in K
        n_ctx = key.shape[2] - query.shape[2]
        self.per_layer[layer] = probs[:, :, :n_ctx].mean(dim=(0, 1)).cpu()

    # The question stage's protocol (``QuestionReader.prefill`` calls observer() and evict()).
    def observer(self, sink_len: int, n_question: int) -> "AttentionMass":
        return self

    def evict(self, cache) -> None:
        """Nothing is evicted: the prefill's cache is dropped right after."""
