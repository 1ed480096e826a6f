"""The engine's caps on a long stream: never over budget, oldest-first, nothing lost uncounted.

With equal-size blocks of T tokens, the caps fix the memory exactly: R = (budget -
sink) // T blocks stay resident, O = arena pages // pages per block stay offloaded,
and after n frames the memory holds the last min(n, R + O) of them, the newest R
resident and the O before them offloaded. The tests assert exactly that after every
ingest, plus the tier bookkeeping and an exact read-back of offloaded K/V.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from videokv_node.memory import ConfigError, Frame, GenerationConfig, MemoryConfig, Question, RequestError, VideoMemoryEngine
from tests.unit.helpers import block_keys, block_values
from videokv_node.memory.store.block import Tier

CAMERAS = ("/cam_front", "/cam_back")


def stream(n: int, seed: int = 0, start: int = 0) -> list[Frame]:
    """Frames start..start+n-1: 8x8 random images, cameras alternating, frame i stamped (i + 1) s."""
    rng = np.random.default_rng(seed)
    return [
        Frame(CAMERAS[i % 2], (i + 1) * 10**9, rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
        for i in range(start, start + n)
    ]


def sink_tokens(adapter) -> int:
    return len(adapter.prefix_ids())


def make_engine(
    adapter, *, policy, window_frames, slack_tokens, offload_blocks, page_tokens=16, extra_offload_bytes=0, retrieve=2
):
    """An engine at the smallest budget the engine accepts plus ``slack_tokens``; arena of ``offload_blocks`` blocks."""
    T = adapter.tokens_per_frame
    L = adapter.geometry.n_layers
    page_bytes = page_tokens * adapter.geometry.bytes_per_token // L  # a page holds one layer's tokens
    pages_per_block = L * -(-T // page_tokens)
    memory = MemoryConfig(
        policy=policy,
        budget_tokens=sink_tokens(adapter) + window_frames * T + T + slack_tokens,
        local_window_tokens=window_frames * T,
        offload_bytes=offload_blocks * pages_per_block * page_bytes + extra_offload_bytes,
        page_tokens=page_tokens,
        retrieve_frames=retrieve,
    )
    return VideoMemoryEngine(adapter, memory, GenerationConfig(max_new_tokens=2, max_new_tokens_limit=8))


def capacities(engine) -> tuple[int, int]:
    """(R, O): how many equal-size blocks the resident budget and the arena hold."""
    T = engine.adapter.tokens_per_frame
    resident = (engine.config.budget_tokens - engine.sink.n_tokens) // T
    arena = engine.store.arena
    if not engine.policy.uses_offload or arena is None:
        return resident, 0
    return resident, arena.n_pages // (engine.adapter.geometry.n_layers * arena.pages_for(T))


def check_memory(engine, stamps: list[int]) -> None:
    """Every invariant of the caps, after ``stamps`` (in ingest order) were ingested."""
    T = engine.adapter.tokens_per_frame
    cfg, s, store = engine.config, engine.stats(), engine.store
    n = len(stamps)
    R, O = capacities(engine)
    n_res = min(n, R)
    n_off = min(n - n_res, O)
    blocks = list(store.blocks())

    # Caps.
    assert s.tokens_resident <= s.budget_tokens == cfg.budget_tokens
    assert s.bytes_offloaded <= s.budget_offload_bytes <= (cfg.offload_bytes if engine.policy.uses_offload else 0)
    # Nothing lost uncounted.
    assert s.frames_ingested == n
    assert s.frames_in_memory + s.frames_evicted == s.frames_ingested
    # Oldest first: memory is the newest frames, the newest R of them resident.
    assert [b.stamp_ns for b in blocks] == stamps[n - n_res - n_off :]
    assert [b.tier for b in blocks] == [Tier.OFFLOADED] * n_off + [Tier.RESIDENT] * n_res
    assert [b.block_id for b in blocks] == sorted(b.block_id for b in blocks)
    # Exact counts.
    assert s.frames_in_memory == n_res + n_off
    assert s.tokens_resident == engine.sink.n_tokens + n_res * T
    assert s.tokens_offloaded == n_off * T
    arena = store.arena
    if arena is not None:
        assert s.bytes_offloaded == n_off * engine.adapter.geometry.n_layers * arena.pages_for(T) * arena.page_bytes
        assert arena.used_pages + arena.free_pages == arena.n_pages
    else:
        assert s.bytes_offloaded == 0
    assert (s.oldest_stamp_ns, s.newest_stamp_ns) == ((blocks[0].stamp_ns, blocks[-1].stamp_ns) if blocks else (0, 0))
    # Tiers hold what they say, and positions increase within each block.
    geo = engine.adapter.geometry
    for b in blocks:
        assert len(b.layers) == geo.n_layers and b.entries == geo.n_layers * T
        for kv in b.layers:
            if b.tier is Tier.RESIDENT:
                assert kv.keys is not None and kv.values is not None and kv.pages == []
                assert kv.keys.shape == kv.values.shape == (geo.n_kv_heads, T, geo.head_dim)
            else:
                assert kv.keys is None and kv.values is None and len(kv.pages) == arena.pages_for(T)
        assert b.n_tokens == T
        assert bool((b.positions[0, 1:] > b.positions[0, :-1]).all())
    offloaded_pages = [p for b in blocks for kv in b.layers for p in kv.pages]
    assert len(offloaded_pages) == len(set(offloaded_pages))


def run_stream(engine, frames: list[Frame], batch_sizes=(1,)) -> list[int]:
    """Ingest ``frames`` in batches cycling through ``batch_sizes``, checking the caps after every ingest."""
    stamps: list[int] = []
    i, j = 0, 0
    while i < len(frames):
        batch = frames[i : i + batch_sizes[j % len(batch_sizes)]]
        blocks = engine.ingest(batch)
        assert [b.stamp_ns for b in blocks] == [f.stamp_ns for f in batch]
        stamps += [f.stamp_ns for f in batch]
        check_memory(engine, stamps)
        i, j = i + len(batch), j + 1
    return stamps


# --- long streams ------------------------------------------------------------
def test_rekv_long_stream_stays_within_both_caps(tiny_adapter):
    # Budget: sink + 2-frame window + 1 frame + 1 frame + 5 tokens -> R = 4; arena: 3 blocks and half a page.
    engine = make_engine(tiny_adapter, policy="rekv", window_frames=2, slack_tokens=tiny_adapter.tokens_per_frame + 5,
                         offload_blocks=3, extra_offload_bytes=8 * tiny_adapter.geometry.bytes_per_token)
    assert capacities(engine) == (4, 3)
    stamps = run_stream(engine, stream(2000), batch_sizes=(1, 3, 1, 7, 2, 5))
    s = engine.stats()
    assert (s.frames_in_memory, s.frames_evicted) == (7, 1993)
    assert engine.ask(Question("what happened?", max_new_tokens=2)).evidence
    assert [b.stamp_ns for b in engine.store.blocks()] == stamps[-7:]


def test_full_long_stream_evicts_and_never_offloads(tiny_adapter):
    engine = make_engine(tiny_adapter, policy="full", window_frames=1, slack_tokens=3 * tiny_adapter.tokens_per_frame,
                         offload_blocks=4)
    assert engine.store.arena is None and engine.stats().budget_offload_bytes == 0
    assert capacities(engine) == (5, 0)
    run_stream(engine, stream(300, seed=1), batch_sizes=(1, 4, 2))
    s = engine.stats()
    assert (s.frames_in_memory, s.frames_evicted, s.bytes_offloaded, s.tokens_offloaded) == (5, 295, 0, 0)


def test_rekv_without_offload_evicts_never_offloads(tiny_adapter):
    engine = make_engine(tiny_adapter, policy="rekv", window_frames=1, slack_tokens=0, offload_blocks=0)
    assert engine.store.arena is None and engine.stats().budget_offload_bytes == 0
    run_stream(engine, stream(200, seed=2), batch_sizes=(1, 2))
    s = engine.stats()
    assert (s.frames_in_memory, s.frames_evicted, s.bytes_offloaded) == (2, 198, 0)


def test_rekv_arena_smaller_than_one_block_evicts(tiny_adapter):
    """An arena of 3 pages cannot hold a block of 4 pages per layer: blocks are evicted and the arena stays empty."""
    T = tiny_adapter.tokens_per_frame
    page_tokens = T // 4
    page_bytes = page_tokens * tiny_adapter.geometry.bytes_per_token // tiny_adapter.geometry.n_layers
    engine = make_engine(tiny_adapter, policy="rekv", window_frames=1, slack_tokens=0, offload_blocks=0,
                         page_tokens=page_tokens, extra_offload_bytes=3 * page_bytes + page_bytes - 1)
    assert engine.store.arena.n_pages == 3
    assert engine.stats().budget_offload_bytes == 3 * page_bytes
    assert capacities(engine) == (2, 0)
    run_stream(engine, stream(60, seed=3), batch_sizes=(1, 3))
    assert engine.store.arena.used_pages == 0
    assert engine.stats().frames_evicted == 58


def test_budget_must_hold_sink_window_and_one_frame(tiny_adapter):
    T = tiny_adapter.tokens_per_frame
    need = sink_tokens(tiny_adapter) + 2 * T + T
    VideoMemoryEngine(tiny_adapter, MemoryConfig(budget_tokens=need, local_window_tokens=2 * T), GenerationConfig())
    with pytest.raises(ConfigError, match=rf"budget_tokens \({need - 1}\) must hold .* >= {need}"):
        VideoMemoryEngine(tiny_adapter, MemoryConfig(budget_tokens=need - 1, local_window_tokens=2 * T), GenerationConfig())


# --- properties --------------------------------------------------------------
@settings(max_examples=15, deadline=None, derandomize=True)
@given(
    policy=st.sampled_from(["full", "rekv"]),
    window_frames=st.integers(1, 3),
    slack_tokens=st.integers(0, 48),
    offload_blocks=st.integers(0, 6),
    page_tokens=st.sampled_from([4, 5, 16, 32]),
    retrieve=st.integers(0, 3),
    n_frames=st.integers(1, 40),
    seed=st.integers(0, 1000),
)
def test_caps_hold_after_every_ingest(
    tiny_adapter, policy, window_frames, slack_tokens, offload_blocks, page_tokens, retrieve, n_frames, seed
):
    """Any caps, any page size: the exact memory after every ingest; a question uses only frames held, in order."""
    engine = make_engine(tiny_adapter, policy=policy, window_frames=window_frames, slack_tokens=slack_tokens,
                         offload_blocks=offload_blocks, page_tokens=page_tokens, retrieve=retrieve)
    stamps = run_stream(engine, stream(n_frames, seed=seed))
    answer = engine.ask(Question("what is there?", max_new_tokens=2))
    evidence = [e.stamp_ns for e in answer.evidence]
    assert evidence and set(evidence) <= set(stamps[-engine.stats().frames_in_memory :])
    assert all(a < b for a, b in zip(evidence, evidence[1:]))
    assert all(e.camera == CAMERAS[(e.stamp_ns // 10**9 - 1) % 2] for e in answer.evidence)
    check_memory(engine, stamps)  # a question changes nothing


# --- offloaded blocks read back exactly --------------------------------------
@pytest.mark.parametrize("page_tokens", [16, 5, 32])
def test_offloaded_blocks_read_back_exactly(tiny_adapter, page_tokens):
    engine = make_engine(tiny_adapter, policy="rekv", window_frames=1, slack_tokens=0, offload_blocks=4, page_tokens=page_tokens)
    L = tiny_adapter.geometry.n_layers
    clones = {}
    for frame in stream(9, seed=4):
        (block,) = engine.ingest([frame])
        clones[block.block_id] = (block_keys(block).clone(), block_values(block).clone())
    blocks = list(engine.store.blocks())
    assert [b.tier for b in blocks] == [Tier.OFFLOADED] * 4 + [Tier.RESIDENT] * 2
    for b in blocks:
        ref_k, ref_v = clones[b.block_id]
        for layer in range(L):
            k, v = engine.store.layer_kv(b, layer)
            assert k.dtype == ref_k.dtype and k.device == ref_k.device
            assert torch.equal(k, ref_k[layer]) and torch.equal(v, ref_v[layer])


# --- reset -------------------------------------------------------------------
def test_reset_forgets_frames_and_frees_the_arena(tiny_adapter):
    engine = make_engine(tiny_adapter, policy="rekv", window_frames=1, slack_tokens=0, offload_blocks=3)
    frames = stream(10, seed=5)
    run_stream(engine, frames)
    before = engine.stats()
    assert before.bytes_offloaded > 0 and before.frames_evicted == 5
    last_id = max(b.block_id for b in engine.store.blocks())

    engine.reset()
    s = engine.stats()
    assert len(engine.store) == 0 and list(engine.store.blocks()) == []
    arena = engine.store.arena
    assert (arena.free_pages, arena.used_pages) == (arena.n_pages, 0)
    assert (s.frames_in_memory, s.tokens_resident, s.tokens_offloaded, s.bytes_offloaded) == (0, engine.sink.n_tokens, 0, 0)
    assert (s.oldest_stamp_ns, s.newest_stamp_ns) == (0, 0)
    # Lifetime counters stay; a reset is not an eviction.
    assert (s.frames_ingested, s.frames_evicted) == (10, 5)
    with pytest.raises(RequestError, match="no frames in memory"):
        engine.ask(Question("what is there?"))

    more = stream(4, seed=6, start=20)
    blocks = engine.ingest(more)
    assert [b.block_id for b in blocks] == list(range(last_id + 1, last_id + 5))
    s = engine.stats()
    assert (s.frames_ingested, s.frames_in_memory, s.frames_evicted) == (14, 4, 5)
    assert [b.tier for b in engine.store.blocks()] == [Tier.OFFLOADED] * 2 + [Tier.RESIDENT] * 2
    answer = engine.ask(Question("what is there?", max_new_tokens=2))
    assert {e.stamp_ns for e in answer.evidence} <= {f.stamp_ns for f in more}
