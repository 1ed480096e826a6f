"""The resident cache (memory/context/resident_cache.py) against a from-scratch ``place_layer`` rebuild.

Compaction keeps order and positions, only keys whose position changes are re-rotated (counted
in ``moved_tokens``; a block that only shifts in the buffer is copied), compression and a
replaced summary token are picked up, and every state equals ``place_layer`` of the same plan.
"""

from __future__ import annotations

import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from videokv_node.memory.store.block import FrameBlock, LayerKV
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.memory.context.resident_cache import ResidentCache
from videokv_node.memory.context.retrieval_cache import Sink, logical_layout, pack_layout, place_layer
from videokv_node.memory.policies.base import present_in

T = 4


def make_block(adapter, block_id: int, start: int, gen: torch.Generator) -> FrameBlock:
    geo = adapter.geometry
    positions = adapter.text_positions(start, T)
    shape = (geo.n_kv_heads, T, geo.head_dim)
    layers = [LayerKV(torch.arange(T), positions.clone(), torch.randn(shape, generator=gen), torch.randn(shape, generator=gen))
              for _ in range(geo.n_layers)]
    return FrameBlock(block_id, "cam", (block_id + 1) * 10**9, positions, torch.zeros(geo.n_layers, geo.n_kv_heads, geo.head_dim), layers)


def setup(adapter, n: int, seed: int = 0):
    geo = adapter.geometry
    gen = torch.Generator().manual_seed(seed)
    sink = Sink(torch.randn(geo.n_layers, geo.n_kv_heads, 3, geo.head_dim, generator=gen),
                torch.randn(geo.n_layers, geo.n_kv_heads, 3, geo.head_dim, generator=gen))
    store = BlockStore(geo, torch.device("cpu"), offload_bytes=0, page_tokens=4)
    blocks = [make_block(adapter, i, 3 + 7 * i, gen) for i in range(n)]  # encoded at scattered positions
    for b in blocks:
        store.add(b)
    return store, sink, blocks, gen


def assert_equals_rebuild(adapter, store, sink, cache, per_layer, targets):
    for layer, blocks in enumerate(per_layer):
        ref_k, ref_v = place_layer(adapter, store, sink, blocks, targets[layer], layer)
        k, v = cache.layer(layer)
        torch.testing.assert_close(k, ref_k, rtol=0, atol=0)
        torch.testing.assert_close(v, ref_v, rtol=0, atol=0)


def test_packed_plan_equals_rebuild_and_a_second_sync_moves_nothing(tiny_adapter):
    a = tiny_adapter
    store, sink, blocks, _ = setup(a, 5)
    cache = ResidentCache(a, store, sink, capacity=8)  # too small on purpose: it must grow
    per_layer = present_in(blocks, a.geometry.n_layers)
    targets, _ = pack_layout(a, sink.n_tokens, per_layer)
    cache.sync(per_layer, targets)
    L = a.geometry.n_layers
    assert cache.moved_tokens == 5 * T * L  # first placement: every block in every layer
    assert_equals_rebuild(a, store, sink, cache, per_layer, targets)
    cache.sync(per_layer, targets)
    assert (cache.moved_tokens, cache.copied_tokens) == (0, 0)


def test_evicting_a_middle_block_under_fixed_positions_compacts_without_rotating(tiny_adapter):
    """HERMES' lazy layout: positions stay where they are; blocks after the hole only move down the buffer."""
    a = tiny_adapter
    store, sink, blocks, _ = setup(a, 5)
    cache = ResidentCache(a, store, sink, capacity=64)
    per_layer = present_in(blocks, a.geometry.n_layers)
    cache.sync(per_layer, logical_layout(sink.n_tokens, per_layer)[0])
    store.evict(blocks[1])
    kept = [blocks[0], blocks[2], blocks[3], blocks[4]]
    per_layer = present_in(kept, a.geometry.n_layers)
    targets, _ = logical_layout(sink.n_tokens, per_layer)
    cache.sync(per_layer, targets)
    assert cache.moved_tokens == 0 and cache.copied_tokens == 3 * T * a.geometry.n_layers  # 3 blocks shifted, per layer
    assert [p.block.block_id for p in cache.placed[0]] == [0, 2, 3, 4]
    assert [p.offset for p in cache.placed[0]] == [3, 3 + T, 3 + 2 * T, 3 + 3 * T]
    assert_equals_rebuild(a, store, sink, cache, per_layer, targets)


def test_packed_eviction_rerotates_only_the_blocks_whose_positions_change(tiny_adapter):
    """Packed layout: dropping the newest block moves nothing; dropping the oldest moves every other one."""
    a = tiny_adapter
    store, sink, blocks, gen = setup(a, 4)
    cache = ResidentCache(a, store, sink, capacity=64)

    def plan(bs):
        per_layer = present_in(bs, a.geometry.n_layers)
        return per_layer, pack_layout(a, sink.n_tokens, per_layer)[0]

    cache.sync(*plan(blocks))
    store.evict(blocks[3])
    cache.sync(*plan(blocks[:3]))
    assert (cache.moved_tokens, cache.copied_tokens) == (0, 0)
    new = make_block(a, 9, 500, gen)
    store.add(new)
    cache.sync(*plan(blocks[:3] + [new]))
    L = a.geometry.n_layers
    assert cache.moved_tokens == T * L  # only the new block
    store.evict(blocks[0])
    per_layer, targets = plan([blocks[1], blocks[2], new])
    cache.sync(per_layer, targets)
    assert cache.moved_tokens == 3 * T * L
    assert_equals_rebuild(a, store, sink, cache, per_layer, targets)


def test_compression_and_a_replaced_summary_are_rewritten(tiny_adapter):
    a = tiny_adapter
    store, sink, blocks, gen = setup(a, 3)
    cache = ResidentCache(a, store, sink, capacity=64)
    per_layer = present_in(blocks, a.geometry.n_layers)
    cache.sync(per_layer, logical_layout(sink.n_tokens, per_layer)[0])
    store.keep(blocks[1], 0, torch.tensor([0, 3]))  # layer 0 keeps 2 of 4 tokens
    blocks[2].protected = True
    kv = blocks[2].layers[1]
    store.replace_layer(blocks[2], 1, torch.randn_like(kv.keys), torch.randn_like(kv.values))
    per_layer = present_in(blocks, a.geometry.n_layers)
    targets, _ = logical_layout(sink.n_tokens, per_layer)
    cache.sync(per_layer, targets)
    assert_equals_rebuild(a, store, sink, cache, per_layer, targets)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), packed=st.booleans())
def test_random_histories_always_equal_a_rebuild(tiny_adapter, seed, packed):
    a = tiny_adapter
    rng = random.Random(seed)
    store, sink, blocks, gen = setup(a, 3, seed)
    cache = ResidentCache(a, store, sink, capacity=4)
    held, next_id = list(blocks), 3
    for _ in range(12):
        r = rng.random()
        if r < 0.4 or len(held) < 2:
            b = make_block(a, next_id, rng.randrange(3, 400), gen)
            next_id += 1
            store.add(b)
            held.append(b)
        elif r < 0.7:
            victim = rng.choice(held)
            store.evict(victim)
            held.remove(victim)
        else:
            b = rng.choice(held)
            layer = rng.randrange(a.geometry.n_layers)
            if b.layers[layer] is not None and b.layers[layer].n_tokens > 1:
                store.keep(b, layer, torch.tensor(sorted(rng.sample(range(b.layers[layer].n_tokens), 1))))
        per_layer = present_in(held, a.geometry.n_layers)
        targets = pack_layout(a, sink.n_tokens, per_layer)[0] if packed else logical_layout(sink.n_tokens, per_layer)[0]
        cache.sync(per_layer, targets)
        assert_equals_rebuild(a, store, sink, cache, per_layer, targets)
