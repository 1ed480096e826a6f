"""The ``spava`` decoder attention, registered through transformers' public ``AttentionInterface``.

The function itself holds no algorithm: each decoder forward passes a *call
object* as the ``spava_call`` keyword (transformers forwards extra keywords of
the model's forward down to every attention call), and the layer's post-RoPE
queries, keys and values go to it: ``ShardPrefill`` / ``ShardDecode`` on a rank of a
job, ``OraclePrefill`` / ``ExactDecode`` in the single-process reference. So the
same model object runs distributed or as the oracle, and no model code is patched.
As for ``videokv``, the name is not a mask function of transformers, so no mask
is built: every call object builds the visibility it needs (batch size 1, no padding).
"""

from __future__ import annotations

from typing import Protocol

import torch
from transformers import AttentionInterface

from videokv_node.spava.kernels import attend, causal_mask
from videokv_node.spava.layout import Layout
from videokv_node.spava.oracle import oracle_attention

ATTN_IMPLEMENTATION = "spava"


class SpavaCall(Protocol):
    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """q (H_q, n, D), k/v (H_kv, m, D) post-RoPE -> (H_q, n, D)."""


class OraclePrefill:
    """Prefill of the whole sequence in one process under the structured mask (``oracle.py``)."""

    def __init__(self, layout: Layout, pool_window: int) -> None:
        self.layout, self.pool_window = layout, pool_window

    def __call__(self, layer, q, k, v, scale):
        return oracle_attention(self.layout, q, k, v, scale, self.pool_window)


class ExactDecode:
    """Exact attention of new tokens over the whole cache: the single-process decode reference."""

    def __call__(self, layer, q, k, v, scale):
        return attend(q, k, v, scale, causal_mask(q.shape[1], k.shape[1], k.device))[0]


def spava_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    spava_call: SpavaCall | None = None,
    **kwargs,
):
    if spava_call is None:
        raise ValueError("the spava attention needs a spava_call= keyword in the decoder's forward (see spava/runner.py)")
    if query.shape[0] != 1:
        raise ValueError("spava attention runs batch size 1 only")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = spava_call(module.layer_idx, query[0], key[0], value[0], scale)  # (H_q, n, D)
    return out.to(query.dtype).transpose(0, 1)[None].contiguous(), None  # (1, n, H_q, D), as sdpa returns


AttentionInterface.register(ATTN_IMPLEMENTATION, spava_attention_forward)


def use_spava_attention(text_config) -> None:
    """Switch a decoder's sub-config (only: vision towers keep theirs) to the ``spava`` attention."""
    text_config._attn_implementation = ATTN_IMPLEMENTATION
