"""The retrieval index (memory/store/block_index.py) and the store's O(1) bookkeeping (issue 16).

Slots are reused after eviction, demotion moves a block's tier mark, top-k over the index equals
a brute-force reference computed here (ties to the newer block), the candidate mask and the recent
window equal the list walks they replace, and the store's stamp range equals a walk over memory.
StreamKV's cached open segment equals encoding the segment for the question, as before.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.helpers import random_frames
from tests.unit.test_policies import GEO, block, store_with
from videokv_node.memory import GenerationConfig, MemoryConfig, VideoMemoryEngine
from videokv_node.memory.store.block import Tier
from videokv_node.memory.scoring.top_k import top_k_masked
from videokv_node.memory.store.block_index import BlockIndex, Candidates
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.memory.config import StreamKVConfig
from videokv_node.memory.policies.base import EncodeJob, recent_within


def test_a_freed_slot_is_reused_and_its_block_leaves_every_mask():
    store = store_with([4] * 5)
    index = store.index
    victim = next(b for b in store.blocks() if b.block_id == 2)
    slot = index.slot_of[2]
    store.evict(victim)
    assert 2 not in index.slot_of and index.blocks[slot] is None and int(index.block_id[slot]) == -1
    assert not bool(index.candidate_mask()[slot])
    store.add(block(7))
    assert index.slot_of[7] == slot  # the freed slot, not a new one
    assert index.blocks[slot].block_id == 7 and len(index) == 5


def test_the_index_grows_past_its_capacity_and_keeps_every_row():
    store = BlockStore(GEO, torch.device("cpu"), offload_bytes=0, page_tokens=4)
    cap = store.index.capacity
    blocks = [block(i) for i in range(cap + 3)]
    for i, b in enumerate(blocks):
        b.key_mean = torch.full_like(b.key_mean, float(i))
        store.add(b)
    assert store.index.capacity >= cap + 3
    for b in blocks:
        slot = store.index.slot_of[b.block_id]
        assert store.index.blocks[slot] is b
        assert torch.equal(store.index.key_mean[:, slot], b.key_mean)


def test_demotion_moves_the_tier_mark_and_the_per_tier_order():
    store = store_with([4] * 4)
    index = store.index
    first, second = list(store.blocks())[:2]
    store.offload(first)
    store.offload(second)
    assert int(index.tier[index.slot_of[first.block_id]]) == 1 and int(index.tier[index.slot_of[second.block_id]]) == 1
    assert [b.block_id for b in store.blocks(Tier.OFFLOADED)] == [0, 1]
    assert [b.block_id for b in store.blocks(Tier.RESIDENT)] == [2, 3]
    assert [b.block_id for b in store.newest_first(Tier.RESIDENT)] == [3, 2]
    assert store.oldest(Tier.RESIDENT).block_id == 2 and store.oldest(Tier.OFFLOADED).block_id == 0


def test_compression_updates_the_layers_a_slot_keeps():
    store = store_with([4] * 2)
    b = next(iter(store.blocks()))
    store.keep(b, 1, torch.tensor([0, 2]))
    slot = store.index.slot_of[b.block_id]
    assert store.index.tokens[slot].tolist() == [4, 2] and store.index.present[slot].tolist() == [True, True]
    store.keep(b, 0, None)
    assert store.index.present[slot].tolist() == [False, True]


def brute_top_k(query, key_means, ids, k):
    """Reference: score every block, sort by (score, id) descending, first k ids."""
    H, D = query.shape
    scored = [(float((query * km).sum()) / (H * D**0.5), bid) for km, bid in zip(key_means, ids)]
    return sorted(bid for _, bid in sorted(scored, reverse=True)[:k])


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), k=st.integers(0, 12), seed=st.integers(0, 10_000), evict=st.integers(0, 10), levels=st.integers(1, 4))
def test_top_k_equals_a_brute_force_reference(n, k, seed, evict, levels):
    """Few distinct score levels force ties at the cut; evictions leave holes and reused slots."""
    rng = random.Random(seed)
    store = BlockStore(GEO, torch.device("cpu"), offload_bytes=0, page_tokens=4)
    held = []
    for i in range(n):
        b = block(i)
        b.key_mean = torch.tensor([[[float(rng.randrange(levels))] + [0.0] * (GEO.head_dim - 1)] * GEO.n_kv_heads] * GEO.n_layers)
        store.add(b)
        held.append(b)
    for b in rng.sample(held, min(evict, n - 1)):
        store.evict(b)
        held.remove(b)
    query = torch.zeros(GEO.n_kv_heads, GEO.head_dim)
    query[:, 0] = 1.0
    picked = sorted(store.index.blocks[s].block_id for s in store.index.top_k(query, 0, store.index.candidate_mask(), k).tolist())
    assert picked == brute_top_k(query, [b.key_mean[0] for b in held], [b.block_id for b in held], k)


def test_top_k_masked_ignores_masked_slots_even_when_they_score_best():
    scores = torch.tensor([9.0, 1.0, 1.0, 5.0])
    mask = torch.tensor([False, True, True, True])
    ids = torch.tensor([0, 1, 2, 3])
    assert sorted(top_k_masked(scores, mask, ids, 2).tolist()) == [2, 3]  # the tie at 1.0 goes to the newer block
    assert top_k_masked(scores, mask, ids, 0).numel() == 0


@pytest.mark.parametrize("max_tokens", [0, 3, 4, 8, 13, 100])
def test_candidate_recent_window_equals_the_list_walk(max_tokens):
    store = store_with([2, 9, 3, 1, 4, 4])
    chosen = [b for b in store.blocks() if b.block_id != 4]
    cands = Candidates.of(store.index, chosen)
    assert [b.block_id for b in cands.recent_within(max_tokens)] == [b.block_id for b in recent_within(chosen, max_tokens)]
    assert [b.block_id for b in cands.blocks()] == [b.block_id for b in chosen]


def test_candidate_mask_filters_cameras_and_whole_time_windows():
    store = BlockStore(GEO, torch.device("cpu"), offload_bytes=0, page_tokens=4)
    for i in range(6):
        store.add(block(i, camera="a" if i % 2 else "b"))  # stamps (i + 1) s
    multi = block(6, camera="a")
    multi.stamps_ns = (3 * 10**9, 8 * 10**9)  # a segment spanning 3..8 s
    store.add(multi)
    index = store.index

    def ids(**kw):
        return [b.block_id for b in Candidates(index, index.candidate_mask(**kw)).blocks()]

    assert ids() == list(range(7))
    assert ids(cameras=["a"]) == [1, 3, 5, 6]
    assert ids(cameras=["nowhere"]) == []
    assert ids(since_ns=3 * 10**9, until_ns=5 * 10**9) == [2, 3, 4]  # block 6 also holds 8 s: out
    assert ids(since_ns=3 * 10**9) == [2, 3, 4, 5, 6]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_stamp_range_equals_a_walk_over_memory(seed):
    rng = random.Random(seed)
    store = BlockStore(GEO, torch.device("cpu"), offload_bytes=0, page_tokens=4)
    next_id = 0
    for _ in range(120):
        if store and rng.random() < 0.45:
            store.evict(rng.choice(list(store.blocks())))
        else:
            store.add(block(next_id))
            next_id += 1
        stamps = [s for b in store.blocks() for s in b.stamps_ns]
        assert store.stamp_range() == ((min(stamps), max(stamps)) if stamps else (0, 0))
    assert len(store._stamp_max) <= 2 * len(store._stamps) + 64  # stale heap entries stay bounded


def streamkv_engine(adapter, **kw):
    cfg = StreamKVConfig(similarity_threshold=0.0, min_segment_frames=2, max_segment_frames=6, compression_ratio=0.0, **kw)
    T, sink = adapter.tokens_per_frame, len(adapter.prefix_ids())
    memory = MemoryConfig(policy="streamkv", budget_tokens=sink + 40 * T, local_window_tokens=4 * T, streamkv=cfg)
    return VideoMemoryEngine(adapter, memory, GenerationConfig(max_new_tokens=2))


def test_streamkv_cached_open_segment_equals_encoding_it_for_the_question(tiny_adapter):
    """Threshold 0: nothing splits (features of random frames are never opposed), so past 6 frames every new frame merges: the cache is
    re-encoded from the merged member on; it must equal one pass over the open segment."""
    e = streamkv_engine(tiny_adapter, max_segment_s=0.0)
    for f in random_frames(9, seed=3):
        e.ingest([f])
    cached = e.policy.open_segment().blocks(e)
    fresh = e.encode_units(EncodeJob(e.policy.pending_units()), provisional=True)
    assert len(cached) == len(fresh) == 6
    for a, b in zip(cached, fresh):
        assert a.stamps_ns == b.stamps_ns and torch.equal(a.positions, b.positions)
        for la, lb in zip(a.layers, b.layers):
            torch.testing.assert_close(la.keys, lb.keys, rtol=0, atol=1e-4)
            torch.testing.assert_close(la.values, lb.values, rtol=0, atol=1e-4)
    stats = e.stats()
    feature = 6 * tiny_adapter.tokens_per_frame * tiny_adapter.embed_tokens([0]).shape[-1] * 4
    assert stats.streamkv_open_segment_bytes == feature + e.store.entry_bytes(sum(b.entries for b in cached))


def test_streamkv_max_segment_s_closes_an_open_segment_by_time(tiny_adapter):
    e = streamkv_engine(tiny_adapter, max_segment_s=2.5)  # frames 1 s apart: a segment spans at most 3 frames
    for f in random_frames(8, seed=4):
        e.ingest([f])
    frames = sorted((b for b in e.store.blocks() if b.kind == "frame"), key=lambda b: b.order)
    summaries = sorted((b for b in e.store.blocks() if b.kind == "summary"), key=lambda b: b.order)
    assert [s.stamps_ns for s in summaries] == [tuple(k * 10**9 for k in (1, 2, 3)), tuple(k * 10**9 for k in (4, 5, 6))]
    assert len(frames) == 6 and len(e.policy.pending_units()) == 2  # frames 7 and 8 wait


def test_streamkv_cache_larger_than_the_budget_never_demotes_the_window(tiny_adapter):
    """Budget: sink + window + 1 frame; a segment that never splits outgrows it. Older blocks are demoted
    for the cache, the window is not, and with nothing left to demote the cache alone stays over."""
    a = tiny_adapter
    T, sink = a.tokens_per_frame, len(a.prefix_ids())
    cfg = StreamKVConfig(similarity_threshold=0.0, min_segment_frames=2, max_segment_frames=6, compression_ratio=0.0,
                         max_segment_s=3.5)
    memory = MemoryConfig(policy="streamkv", budget_tokens=sink + 3 * T, local_window_tokens=2 * T, streamkv=cfg)
    e = VideoMemoryEngine(a, memory, GenerationConfig(max_new_tokens=1))
    L = a.geometry.n_layers
    for f in random_frames(11, seed=5):  # segments of 4 frames (+ a summary each) close by time
        e.ingest([f])
        window = {b.block_id for b in e.policy.encoding_context(e.store, EncodeJob([]))}
        assert all(b.tier is Tier.RESIDENT for b in e.store.blocks() if b.block_id in window)
        assert e.store.resident_entries <= (memory.budget_tokens - sink) * L
    assert e.store.count(Tier.OFFLOADED) > 0  # older blocks made room for the cache
    assert len(e.policy.pending_units()) == 3


@settings(max_examples=80, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "add", "add", "restore", "evict", "demote", "clear"]), st.integers(0, 10**6)),
                    max_size=160),
       capacity=st.integers(1, 8))
def test_creation_order_is_kept_across_insert_evict_demote_and_restore(ops, capacity):
    """``ordered`` and ``by_age`` equal the held blocks sorted by id, here by ``sorted``, after any
    sequence of inserts (new ids, or a lower free id as a snapshot restore may enter them), evictions
    (dead entries, compaction, slots reused), demotions and clears; masks pick any subset."""
    index = BlockIndex(GEO, torch.device("cpu"), capacity=capacity)
    held: dict[int, object] = {}
    next_id = 0
    for op, r in ops:
        if op == "add" or (op == "restore" and not held):
            b = block(next_id)
            next_id += 1
        elif op == "restore":  # an id below the newest, not held
            free = [i for i in range(max(held)) if i not in held]
            if not free:
                continue
            b = block(free[r % len(free)])
        elif op == "evict" and held:
            index.remove(held.pop(sorted(held)[r % len(held)]))
            continue
        elif op == "demote" and held:
            victim = held[sorted(held)[r % len(held)]]
            victim.tier = Tier.OFFLOADED
            index.move(victim)
            continue
        elif op == "clear":
            index.clear()
            held.clear()
            continue
        else:
            continue
        index.insert(b)
        held[b.block_id] = b
        rng = random.Random(r)
        chosen = {i for i in held if rng.random() < 0.5}
        mask = torch.zeros(index.capacity, dtype=torch.bool)
        for i in chosen:
            mask[index.slot_of[i]] = True
        assert [index.blocks[s].block_id for s in index.by_age(mask).tolist()] == sorted(chosen)
        assert [index.blocks[s].block_id for s in index.ordered().tolist()] == sorted(held)
    assert [index.blocks[s].block_id for s in index.ordered().tolist()] == sorted(held)
    assert len(index) == len(held)
