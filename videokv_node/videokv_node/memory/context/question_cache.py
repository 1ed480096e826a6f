"""A question's cache from its selection (``context/selection.py``): what each layer attends to.

- ``Static``: each layer's blocks (those that keep tokens there) in time order, placed by the
  policy's layout before the pass (from the resident cache where the engine keeps one).
- ``InPass`` (ReKV's per-layer retrieval): a ``RetrievingCache`` whose layer ``l`` is filled when the
  decoder reaches it, with ``fixed`` and the top ``k`` of the pool by layer ``l``'s question query,
  captured by the ``q_proj`` hook (``QueryCapture``) just before (``context/retrieval_cache.py``).
  Every layer then holds the same number of tokens, planned before the pass: the layout needs only
  the sizes, so it is computed for any ``k`` pool blocks. An ``InPass`` whose pool fits in ``k`` is
  ``Static`` (nothing to score).

The engine records what the pass attended to from the returned ``QuestionContext``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from transformers.cache_utils import Cache

from videokv_node.memory.context.retrieval_cache import QueryCapture, RetrievingCache, Sink, Targets, place_layer
from videokv_node.memory.context.selection import InPass, Selection, Static
from videokv_node.memory.store.block import FrameBlock
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.models.adapter import VideoLLMAdapter

Layout = Callable[[int, Sequence[Sequence[FrameBlock]]], tuple[Targets, int]]  # MemoryPolicy.layout
Place = Callable[[Sequence[Sequence[FrameBlock]], Targets], Cache]  # the engine's placement of a plan


@dataclass(slots=True)
class QuestionContext:
    cache: Cache  # what the question's pass attends to after the sink
    chosen: dict[int, FrameBlock]  # blocks attended to by id (in-pass: filled as layers run)
    next_pos: int  # position of the first question token
    layer_blocks: list[list[int]]  # per layer, the block ids attended to, in cache order (in-pass: filled as layers run)
    context_len: int  # largest per-layer context, sink included


def question_context(selection: Selection, adapter: VideoLLMAdapter, store: BlockStore, sink: Sink, layout: Layout,
                     place: Place, capture: QueryCapture) -> QuestionContext:
    """The cache ``selection`` asks for, with what it attends to. Refuses (RuntimeError) a ``Static`` set
    that does not name every layer once, and an ``InPass`` over compressed or unequal blocks."""
    n_layers = adapter.geometry.n_layers
    if isinstance(selection, InPass):
        selection = selection.settled(n_layers)
    if isinstance(selection, Static):
        if len(selection.per_layer) != n_layers:
            raise RuntimeError(f"the policy's selection names {len(selection.per_layer)} layers; the model has {n_layers}")
        per_layer = [sorted((b for b in blocks if b.layers[l] is not None), key=lambda b: b.order)
                     for l, blocks in enumerate(selection.per_layer)]
        targets, next_pos = layout(sink.n_tokens, per_layer)
        context_len = max(sink.n_tokens + sum(b.layer_tokens(l) for b in blocks) for l, blocks in enumerate(per_layer))
        return QuestionContext(place(per_layer, targets), {b.block_id: b for blocks in per_layer for b in blocks}, next_pos,
                               [[b.block_id for b in blocks] for blocks in per_layer], context_len)
    return _in_pass(selection, adapter, store, sink, layout, capture)


def _in_pass(selection: InPass, adapter: VideoLLMAdapter, store: BlockStore, sink: Sink, layout: Layout,
             capture: QueryCapture) -> QuestionContext:
    n_layers = adapter.geometry.n_layers
    fixed = list(selection.fixed)
    index, pool_mask = store.index, selection.pool.mask
    k = min(selection.k, selection.pool.count)
    sizes = index.tokens[pool_mask]  # (N, L) kept tokens, read on the index: no walk over the pool
    uniform = sizes.numel() == 0 or bool((sizes == sizes[0, 0]).all() and (index.encoded[pool_mask] == sizes[0, 0]).all())
    if not uniform or any(b.layer_tokens(l) != b.n_tokens for b in fixed for l in range(n_layers)):
        raise RuntimeError("per-layer retrieval needs uncompressed, equal-size blocks")
    # The plan's layout needs only its sizes: k pool blocks of the pool's one size (any k of them).
    plan = sorted(fixed + index.blocks_of(index.newest(pool_mask, k)), key=lambda b: b.order)
    _, next_pos = layout(sink.n_tokens, [plan])
    n_ctx = sink.n_tokens + sum(b.n_tokens for b in plan)
    chosen: dict[int, FrameBlock] = {b.block_id: b for b in fixed}
    layer_blocks: list[list[int]] = [[] for _ in range(n_layers)]

    def materialize(layer: int):
        query = capture.mean(layer)  # (H, D)
        picked = index.blocks_of(index.top_k(query, layer, pool_mask, k))
        blocks = sorted(fixed + picked, key=lambda b: b.order)
        chosen.update((b.block_id, b) for b in picked)
        layer_blocks[layer] = [b.block_id for b in blocks]
        targets, _ = layout(sink.n_tokens, [blocks])
        return place_layer(adapter, store, sink, blocks, targets[0], layer)

    return QuestionContext(RetrievingCache(n_ctx, materialize, n_layers), chosen, next_pos, layer_blocks, n_ctx)
