"""Turning memory blocks into a transformers ``Cache`` the decoder can attend to.

Two ways, both through the public Cache API:

- ``placed_cache``: a plain ``DynamicCache`` holding the sink and a list of
  blocks, used while encoding frames and for questions that need no retrieval.
- ``RetrievingCache``: for per-layer retrieval inside one forward pass. Each
  layer's cache is empty until the decoder calls ``update`` on it; by then the
  layer's ``q_proj`` forward hook has captured the question's queries for that
  layer, so the layer picks its own top-k blocks right there, as ReKV retrieves
  inside attention, without patching attention code.

Placement: the sink keeps positions [0, S); blocks follow in time order at
consecutive positions, each key re-rotated from the position it was encoded at
(exact: ``models/rope.py``). Consecutive placement keeps positions bounded on an
endless stream and treats retrieved frames as adjacent, which is also what
StreamKV prescribes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from videokv_node.memory.block import FrameBlock
from videokv_node.memory.block_store import BlockStore
from videokv_node.models.adapter import VideoLLMAdapter


class Sink:
    """The prompt tokens before the first frame, resident for the engine's lifetime: (L, H, S, D)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys = keys
        self.values = values

    @property
    def n_tokens(self) -> int:
        return self.keys.shape[2]


def place_layer(
    adapter: VideoLLMAdapter, store: BlockStore, sink: Sink, blocks: Sequence[FrameBlock], layer: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's sink + blocks at consecutive positions -> (1, H, S + sum T, D) K and V.

    All blocks are rotated in one call over their concatenated keys: per-block
    calls made placement cost grow with Python overhead per block (docs/BENCHMARKS.md).
    """
    if not blocks:
        return sink.keys[layer][None], sink.values[layer][None]
    kvs = [store.layer_kv(block, layer) for block in blocks]  # each (H, T, D)
    stored = torch.cat([block.positions for block in blocks])  # (N,) positions the keys carry
    target = torch.arange(sink.n_tokens, sink.n_tokens + stored.numel())
    moved = adapter.rotate_keys(torch.cat([k for k, _ in kvs], dim=1), target - stored)  # (H, N, D)
    keys = torch.cat([sink.keys[layer], moved], dim=1)
    values = torch.cat([sink.values[layer]] + [v for _, v in kvs], dim=1)
    return keys[None], values[None]


def placed_cache(
    adapter: VideoLLMAdapter, store: BlockStore, sink: Sink, blocks: Sequence[FrameBlock]
) -> tuple[DynamicCache, int]:
    """A DynamicCache of sink + blocks, and the next free position."""
    layers = [place_layer(adapter, store, sink, blocks, layer) for layer in range(adapter.geometry.n_layers)]
    next_pos = sink.n_tokens + sum(b.n_tokens for b in blocks)
    return DynamicCache(ddp_cache_data=layers), next_pos


class _RetrievingLayer(DynamicLayer):
    """A DynamicLayer that fills itself on first ``update`` from a callback, then behaves as usual.

    ``get_seq_length`` reports the planned context length before it is filled,
    so the causal mask built before layer 0 runs has the right size.
    """

    def __init__(self, planned_length: int, materialize: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> None:
        super().__init__()
        self._planned = planned_length
        self._materialize = materialize

    def get_seq_length(self) -> int:
        return super().get_seq_length() if self.is_initialized else self._planned

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            keys, values = self._materialize()  # (1, H, planned, D)
            if keys.shape[-2] != self._planned:
                raise RuntimeError(f"layer context has {keys.shape[-2]} tokens, planned {self._planned}")
            self.lazy_initialization(key_states, value_states)
            self.keys, self.values = keys, values
        return super().update(key_states, value_states, *args, **kwargs)


class RetrievingCache(Cache):
    """One ``_RetrievingLayer`` per decoder layer; ``chosen[layer]`` records what each layer attended to."""

    def __init__(self, planned_length: int, materialize: Callable[[int], tuple[torch.Tensor, torch.Tensor]], n_layers: int):
        layers = [_RetrievingLayer(planned_length, lambda layer=layer: materialize(layer)) for layer in range(n_layers)]
        super().__init__(layers=layers)


class QueryCapture:
    """Mean pre-RoPE query per layer of the tokens of one forward pass, grouped per KV head.

    Filled by forward hooks on the adapter's ``query_modules``; ``mean(layer)`` is
    (H_kv, D): the question's queries averaged over tokens and over the query
    heads that share each KV head (GQA).
    """

    def __init__(self, n_q_heads: int, n_kv_heads: int, head_dim: int) -> None:
        self.n_q_heads, self.n_kv_heads, self.head_dim = n_q_heads, n_kv_heads, head_dim
        self._means: dict[int, torch.Tensor] = {}

    def hook(self, layer: int):
        def _hook(module, inputs, output):  # output: (B, n, H_q * D)
            q = output[0].float().view(-1, self.n_q_heads, self.head_dim).mean(0)  # (H_q, D)
            self._means[layer] = q.view(self.n_kv_heads, -1, self.head_dim).mean(1)  # (H_kv, D)

        return _hook

    def mean(self, layer: int) -> torch.Tensor:
        if layer not in self._means:
            raise RuntimeError(f"no query captured for layer {layer}: q_proj must run before the cache update")
        return self._means[layer]

    @contextmanager
    def attached(self, modules: Sequence[torch.nn.Module]) -> Iterator["QueryCapture"]:
        handles = [m.register_forward_hook(self.hook(i)) for i, m in enumerate(modules)]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()


def top_k_blocks(query_mean: torch.Tensor, key_means: torch.Tensor, k: int) -> list[int]:
    """Indices of the ``k`` best blocks for one layer, best first.

    query_mean: (H_kv, D); key_means: (N, H_kv, D). Score = mean over heads of
    q_h . k_h / sqrt(D), the scaled dot product attention would use.
    """
    scores = torch.einsum("hd,nhd->n", query_mean, key_means) / (key_means.shape[1] * key_means.shape[2] ** 0.5)
    k = min(k, scores.numel())
    # Ties broken towards the newer block (stable descending sort on reversed order) for determinism.
    order = torch.sort(scores.flip(0), descending=True, stable=True).indices[:k]
    return (scores.numel() - 1 - order).tolist()
