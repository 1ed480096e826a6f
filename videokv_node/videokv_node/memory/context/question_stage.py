"""Question-time stages: what happens to the assembled context once the question is prefilled.

``none``: nothing. ``tgvkv``: TGV-KV (seed 004), text-grounded eviction of the
context after the question's prefill and before decoding: per-layer budgets
from text-to-vision attention (TVB), visual KV ranked by text-weighted
attention (TWR), text KV retained first (TPR). It works on whatever context
the memory policy assembled, so it composes with every policy.

Choices where the paper (written for one image and its prompt, with the
attention matrix of a full prefill at hand) does not fit a memory:
- The only text queries available at question time are the question's own
  tokens (the prompt sink and the video were encoded earlier), so the rows of
  A_TT and A_TV are the question tokens; text *columns* are the prompt sink
  and the question, vision columns are every memory token between them.
- Attention is averaged over heads (the paper avoids head-wise budgets).
- The budget B is ``keep_ratio`` of the assembled context's entries over all
  layers (the paper's retention rate), split across layers by TVB.
- Multiple-choice answers are read from the prefill's logits, so eviction,
  which only changes decoding, is skipped for them.
"""

from __future__ import annotations

import math

import torch
from transformers.cache_utils import Cache

from videokv_node.memory.config import MemoryConfig, TGVKVConfig
from videokv_node.memory.scoring.tgvkv import text_prioritised_keep, text_weighted_scores, tv_budgets
from videokv_node.models.attention import attention_probs


class TGVKVStage:
    """Collects each layer's question-row attention during the prefill, then evicts per layer."""

    name = "tgvkv"

    def __init__(self, config: TGVKVConfig) -> None:
        self.config = config
        self._rows: dict[int, torch.Tensor] = {}  # layer -> (n_q, K_l) head-mean attention of the question rows
        self._sink = 0
        self._n_q = 0
        self.last_budgets: list[int] = []  # per layer, for tests and debugging

    def observer(self, sink_len: int, n_question: int):
        self._rows.clear()
        self._sink, self._n_q = sink_len, n_question

        def observe(layer: int, query: torch.Tensor, key: torch.Tensor, scale: float) -> None:
            self._rows[layer] = attention_probs(query, key, scale).mean(0)  # (n_q, K_l)

        return observe

    def evict(self, cache: Cache) -> None:
        n_layers = len(cache.layers)
        lengths = [int(cache.layers[l].keys.shape[-2]) for l in range(n_layers)]
        s, nq = self._sink, self._n_q
        tv_mass, per_layer = [], []
        for l in range(n_layers):
            a = self._rows[l]  # (n_q, K_l)
            k_len = lengths[l]
            vis = torch.arange(s, k_len - nq)
            text = torch.cat([torch.arange(s), torch.arange(k_len - nq, k_len)])
            a_tv, a_tt = a[:, vis], a[:, text]
            # The first query row that can see each text column: every row sees the sink; a question
            # token is seen from its own row on.
            first_row = torch.cat([torch.zeros(s, dtype=torch.long), torch.arange(nq)])
            col_of_row = torch.arange(s, s + nq)  # question row i is text column s + i
            s_text, s_vis = text_weighted_scores(a_tt, a_tv, first_row, col_of_row)
            tv_mass.append(float(a_tv.sum()))
            per_layer.append((text, vis, s_text, s_vis))
        total = math.ceil(self.config.keep_ratio * sum(lengths))
        budgets = tv_budgets(torch.tensor(tv_mass), total, caps=lengths, floor=[1] * n_layers)
        self.last_budgets = budgets
        for l, (text, vis, s_text, s_vis) in enumerate(per_layer):
            keep = text_prioritised_keep(budgets[l], text, vis, s_text, s_vis).to(cache.layers[l].keys.device)
            layer = cache.layers[l]
            layer.keys = layer.keys[:, :, keep]
            layer.values = layer.values[:, :, keep]
        self._rows.clear()


def make_question_stage(config: MemoryConfig) -> TGVKVStage | None:
    return TGVKVStage(config.tgvkv) if config.question_stage == "tgvkv" else None
