"""Turning memory blocks into a transformers ``Cache`` the decoder can attend to.

Two ways, both through the public Cache API:

- ``placed_cache``: a plain ``DynamicCache`` holding, per layer, the sink and
  that layer's blocks; used while encoding and for questions whose context is
  known before the pass. Layers may hold different blocks and so different
  lengths (the ``videokv`` attention masks each layer by its own length).
- ``RetrievingCache``: for ReKV's per-layer retrieval inside one forward pass.
  Each layer's cache is empty until the decoder calls ``update`` on it; by then
  the layer's ``q_proj`` forward hook has captured the question's queries for
  that layer, so the layer picks its own top-k blocks right there, as ReKV
  retrieves inside attention, without patching attention code.

Placement: the sink keeps positions [0, S). A layout (``pack_layout`` by
default, see ``VideoLLMAdapter.pack``) gives each kept token its position now,
and each key is re-rotated from the position it was encoded at (exact:
``models/rope.py``). The default packs each layer's tokens consecutively and
right-aligns the layers on one end position, so that in every layer the
memory sits right before the question: StreamKV's "retrieved tokens treated as
consecutive", which also keeps positions bounded on an endless stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from videokv_node.memory.scoring.queries import query_means
from videokv_node.memory.store.block import FrameBlock
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.models.adapter import VideoLLMAdapter

# Per layer, the target positions (P, t) of each of its blocks' kept tokens, in the layer's block order.
Targets = list[list[torch.Tensor]]


class Sink:
    """The prompt tokens before the first frame, resident for the engine's lifetime: (L, H, S, D)."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.keys = keys
        self.values = values

    @property
    def n_tokens(self) -> int:
        return self.keys.shape[2]


def stored_positions(block: FrameBlock, layer: int) -> torch.Tensor:
    """(P, t) positions the kept keys of ``block`` in ``layer`` are rotated at."""
    kv = block.kept(layer)
    if kv.n_tokens == block.n_tokens:  # nothing dropped: the index is 0..T-1 (ascending, unique)
        return block.positions
    return block.positions[:, kv.index]


def pack_layout(adapter: VideoLLMAdapter, sink_len: int, per_layer: Sequence[Sequence[FrameBlock]]) -> tuple[Targets, int]:
    """Consecutive placement after the sink, layers right-aligned on one end; returns (targets, next position)."""
    packed, ends = [], []
    for layer, blocks in enumerate(per_layer):
        targets, end = adapter.pack([stored_positions(b, layer) for b in blocks], sink_len)
        packed.append(targets)
        ends.append(end)
    end = max(ends, default=sink_len)
    # Departure P12 (docs/POLICIES.md): a layer holding fewer tokens starts later, leaving a gap after the
    # sink (StreamKV's code under `paper`: 6 to 10 retrieved frames a layer, up to 4 x 196 = 784 positions);
    # the papers' code packs each layer from the init tokens on.
    # Layers already ending there keep their views: a new tensor per block per layer cost ~10K ops a frame.
    return [ts if e == end else [t + (end - e) for t in ts] for ts, e in zip(packed, ends)], end


def logical_layout(sink_len: int, per_layer: Sequence[Sequence[FrameBlock]]) -> tuple[Targets, int]:
    """Tokens stay at their logical positions (HERMES' lazy re-indexing); next position after the largest."""
    targets = [[b.kept(layer).logical for b in blocks] for layer, blocks in enumerate(per_layer)]
    # One reduction per layer, not one per block: this runs for every frame and question.
    end = max((int(torch.cat(ts, dim=1).max()) + 1 for ts in targets if ts and sum(t.numel() for t in ts)), default=sink_len)
    return targets, max(end, sink_len)


def place_layer(
    adapter: VideoLLMAdapter,
    store: BlockStore,
    sink: Sink,
    blocks: Sequence[FrameBlock],
    targets: Sequence[torch.Tensor],
    layer: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's sink + blocks at ``targets`` -> (1, H, S + sum t, D) K and V.

    All blocks are rotated in one call over their concatenated keys: per-block
    calls made placement cost grow with Python overhead per block (docs/BENCHMARKS.md).
    """
    if not blocks:
        return sink.keys[layer][None], sink.values[layer][None]
    kvs = [store.layer_kv(block, layer) for block in blocks]  # each (H, t, D)
    stored = torch.cat([stored_positions(b, layer) for b in blocks], dim=1)  # (P, N)
    target = torch.cat(list(targets), dim=1)  # (P, N)
    moved = adapter.rotate_keys(torch.cat([k for k, _ in kvs], dim=1), target - stored)  # (H, N, D)
    keys = torch.cat([sink.keys[layer], moved], dim=1)
    values = torch.cat([sink.values[layer]] + [v for _, v in kvs], dim=1)
    return keys[None], values[None]


def placed_cache(
    adapter: VideoLLMAdapter, store: BlockStore, sink: Sink, per_layer: Sequence[Sequence[FrameBlock]], targets: Targets
) -> DynamicCache:
    """A DynamicCache whose layer ``l`` holds the sink and ``per_layer[l]`` at ``targets[l]``."""
    layers = [place_layer(adapter, store, sink, blocks, targets[l], l) for l, blocks in enumerate(per_layer)]
    return DynamicCache(ddp_cache_data=layers)


class _RetrievingLayer(DynamicLayer):
    """A DynamicLayer that fills itself on first ``update`` from a callback, then behaves as usual.

    ``get_seq_length`` reports the planned context length before it is filled.
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
    """One ``_RetrievingLayer`` per decoder layer."""

    def __init__(self, planned_length: int, materialize: Callable[[int], tuple[torch.Tensor, torch.Tensor]], n_layers: int):
        layers = [_RetrievingLayer(planned_length, partial(materialize, layer)) for layer in range(n_layers)]
        super().__init__(layers=layers)


class QueryCapture:
    """Pre-RoPE queries per layer of the tokens of one forward pass, grouped per KV head.

    Filled by forward hooks on the adapter's ``query_modules``. ``mean(layer)``
    is (H_kv, D): the queries averaged over tokens and over the query heads
    that share each KV head (GQA). With ``keep_all`` the full (n, H_q, D)
    queries are kept too (``all(layer)``), for policies that score with them.
    """

    def __init__(self, n_q_heads: int, n_kv_heads: int, head_dim: int, keep_all: bool = False, rows: slice | None = None) -> None:
        self.n_q_heads, self.n_kv_heads, self.head_dim = n_q_heads, n_kv_heads, head_dim
        self.keep_all = keep_all
        self.rows = rows or slice(None)  # tokens ``mean`` averages over (ReKV: the question's own, question_span.py)
        self._means: dict[int, torch.Tensor] = {}
        self._all: dict[int, torch.Tensor] = {}

    def hook(self, layer: int):
        def _hook(module, inputs, output):  # output: (B, n, H_q * D)
            q = output[0].float().view(-1, self.n_q_heads, self.head_dim)  # (n, H_q, D)
            self._means[layer] = query_means(q[self.rows], self.n_kv_heads)  # (H_kv, D)
            if self.keep_all:
                self._all[layer] = q

        return _hook

    def mean(self, layer: int) -> torch.Tensor:
        if layer not in self._means:
            raise RuntimeError(f"no query captured for layer {layer}: q_proj must run before the cache update")
        return self._means[layer]

    def all(self, layer: int) -> torch.Tensor:
        return self._all[layer]

    @contextmanager
    def attached(self, modules: Sequence[torch.nn.Module]) -> Iterator["QueryCapture"]:
        handles = [m.register_forward_hook(self.hook(i)) for i, m in enumerate(modules)]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
