"""HERMES' pseudo-queries run through the model over the live cache (``memory.hermes.pseudo_queries: live``).

HERMES' script (``pseudo_forward`` in inference/llavaov_online_official.py) feeds a local, a
global and a mixed ("local; global") question through the language model on top of the KV
cache as it stands before each compression, with ``output_attentions``, and scores each layer
with the attention its queries pay to the cached video tokens: deep layers with the global
query, middle layers with the mixed one (shallow layers keep by recency only). Each query
therefore sees, in layer l, hidden states that attended to the live cache in layers < l;
the ``probe`` mode instead reads one query's pre-RoPE vectors once, over the prompt alone.

The script's score of a layer is the softmax attention of every pseudo-query token over the
whole cache (sink and the query's own earlier tokens included in the softmax), averaged over
heads and query tokens, then restricted to the video tokens: exactly what ``pseudo_attention``
returns. The pseudo tokens' KV is thrown away with the cache built for them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers.cache_utils import Cache

from videokv_node.models.adapter import VideoLLMAdapter
from videokv_node.models.attention import attention_probs


def mixed_query(local: str, global_: str) -> str:
    """The middle layers' query of HERMES' script: ``local_question + "; " + global_question``."""
    return f"{local}; {global_}"


@torch.inference_mode()
def pseudo_attention(adapter: VideoLLMAdapter, cache: Cache, text: str, start_pos: int, sink_len: int) -> list[torch.Tensor]:
    """Per layer, (N_l,) float32 on CPU: the attention ``text``'s tokens pay to each cached non-sink token.

    ``cache`` holds, per layer, the sink (its first ``sink_len`` tokens) then that layer's N_l
    cached tokens, at the positions they stand at; the text is placed from ``start_pos`` on.
    The cache is appended to (pass one built for this call). Each layer's vector is the mean
    over query heads and query tokens of the causal softmax over all keys, read at the cached
    tokens: it sums to at most 1 (the rest went to the sink and the query's own tokens).
    """
    ids = adapter.text_ids(text)
    scores: dict[int, torch.Tensor] = {}

    def observe(layer: int, query: torch.Tensor, key: torch.Tensor, scale: float) -> None:
        n_q, n_k = query.shape[2], key.shape[2]
        probs = attention_probs(query, key, scale)  # (H_q, n_q, K) with K = sink + N_l + n_q
        scores[layer] = probs[:, :, sink_len : n_k - n_q].mean(dim=(0, 1)).cpu()  # (N_l,)

    adapter.forward(adapter.embed_tokens(ids), adapter.text_positions(start_pos, len(ids)), cache, logits=False, observer=observe)
    return [scores[layer] for layer in range(adapter.geometry.n_layers)]


def live_scores(
    adapter: VideoLLMAdapter, make_cache: Callable[[], Cache], local: str, global_: str, start_pos: int, sink_len: int
) -> dict[str, list[torch.Tensor]]:
    """The attention scores of both scored roles: ``{"deep": global query's, "middle": mixed query's}``,
    each a list over layers of (N_l,) (``pseudo_attention``); ``make_cache()`` builds a fresh live cache."""
    return {
        "deep": pseudo_attention(adapter, make_cache(), global_, start_pos, sink_len),
        "middle": pseudo_attention(adapter, make_cache(), mixed_query(local, global_), start_pos, sink_len),
    }
