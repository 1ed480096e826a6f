"""The decoder attention the memory engine runs on, registered through transformers' ``AttentionInterface``.

Why a registered attention function and not the stock ``sdpa``: memory
policies give decoder layers contexts of *different lengths* (StreamKV's
layer-adaptive retrieval, HERMES' per-layer eviction, TGV-KV's per-layer
budgets), while transformers builds one causal mask, sized from layer 0, for
all layers. So under ``videokv`` no mask is built by transformers (the name is
not in ``ALL_MASK_ATTENTION_FUNCTIONS``, so ``create_causal_mask`` returns
None) and each layer builds its own from the lengths it actually has. That is
exact because the engine never pads: every cached key is visible and the new
tokens are causal among themselves, so the mask of query ``i`` of ``q`` against
``K`` keys is ``j <= K - q + i``. The engine runs batch size 1, except the
re-reading of frames of one size (``memory/questions/locate.py``), whose rows have the
same lengths and so the same mask; an observer reads batch 1 only. A caller that
needs another mask gives it (``videokv_mask``, (1, 1, q, K) boolean, the same for every
layer): several frames prefilled in one pass, each seeing only its own context
(``memory/context/batch_prefill.py``).

Second reason: policies need attention scores (MuKV's last-layer importance,
HERMES' pseudo-query attention, TGV-KV's text-to-vision attention). An
*observer* passed as the ``videokv_observer`` keyword of the decoder's forward
reaches this function (transformers forwards extra keywords down to the
attention call) and sees each layer's post-RoPE queries and keys, without
patching any attention code and without switching every layer to eager
attention.

This is the documented extension point (https://huggingface.co/docs/transformers/en/attention_interface);
it is set on the decoder's sub-config only, so vision towers keep their
bidirectional attention.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

ATTN_IMPLEMENTATION = "videokv"

# observer(layer_idx, query (B, H_q, q, D) post-RoPE, key (B, H_kv, K, D) post-RoPE, scaling)
AttentionObserver = Callable[[int, torch.Tensor, torch.Tensor, float], None]


def offset_causal_mask(q_len: int, kv_len: int, device: torch.device) -> torch.Tensor | None:
    """(1, 1, q, K) boolean mask: query i sees keys j <= K - q + i; None when q == 1 (it sees everything)."""
    if q_len == 1:
        return None
    i = torch.arange(q_len, device=device)[:, None]
    j = torch.arange(kv_len, device=device)[None, :]
    return (j <= (kv_len - q_len) + i)[None, None]


def videokv_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    videokv_observer: AttentionObserver | None = None,
    videokv_mask: torch.Tensor | None = None,
    **kwargs,
):
    if query.shape[0] != 1 and videokv_observer is not None:
        raise ValueError("an attention observer reads batch size 1 only (one camera memory per forward)")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if videokv_observer is not None:
        videokv_observer(module.layer_idx, query, key, scale)
    if videokv_mask is None:
        mask = offset_causal_mask(query.shape[2], key.shape[2], query.device)
    elif videokv_mask.shape[-2:] != (query.shape[2], key.shape[2]):
        raise ValueError(f"mask {tuple(videokv_mask.shape)} for {query.shape[2]} queries over {key.shape[2]} keys")
    else:
        mask = videokv_mask
    kwargs.pop("is_causal", None)
    return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scale, is_causal=False, **kwargs)


AttentionInterface.register(ATTN_IMPLEMENTATION, videokv_attention_forward)


def attention_probs(query: torch.Tensor, key: torch.Tensor, scale: float, rows: slice | None = None) -> torch.Tensor:
    """Exact softmax attention of (some of) the queries a layer computed: (H_q, q', K) in float32.

    For observers. ``rows`` picks query rows (default all); the causal offset is
    applied as in ``videokv_attention_forward``. GQA keys are repeated to the
    query heads.
    """
    q = query[0].float()  # (H_q, q, D)
    k = key[0].float()  # (H_kv, K, D)
    groups = q.shape[0] // k.shape[0]
    k = k.repeat_interleave(groups, dim=0)  # (H_q, K, D)
    logits = torch.einsum("hqd,hkd->hqk", q, k) * scale
    mask = offset_causal_mask(q.shape[1], k.shape[1], q.device)
    if mask is not None:
        logits = logits.masked_fill(~mask[0], float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    return probs if rows is None else probs[:, rows]


def use_videokv_attention(model: torch.nn.Module, text_config) -> None:
    """Switch the decoder (only) of ``model`` to the ``videokv`` attention.

    ``text_config`` is the decoder's own sub-config object: setting it there
    leaves the vision tower's config, and so its attention, untouched.
    """
    text_config._attn_implementation = ATTN_IMPLEMENTATION
