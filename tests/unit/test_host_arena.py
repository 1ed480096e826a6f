"""HostKVArena on a hand-made geometry: exact page ids, exact round trips, a fixed footprint.

Geometry: 2 layers, 2 KV heads, head_dim 4, float32 -> 2 * 2 * 2 * 4 * 4 = 128 bytes
per token over all layers, 64 per layer; a page holds 4 tokens of one layer: 256 bytes.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from videokv_node.memory.store.host_arena import HostKVArena
from videokv_node.models.adapter import KVGeometry

GEO = KVGeometry(n_layers=2, n_kv_heads=2, head_dim=4, n_q_heads=2, dtype=torch.float32)
PAGE_TOKENS = 4
PAGE_BYTES = PAGE_TOKENS * 64


def kv(n_tokens: int, seed: int, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """Random one-layer (H, T, D) K and V."""
    g = torch.Generator().manual_seed(seed)
    shape = (GEO.n_kv_heads, n_tokens, GEO.head_dim)
    return torch.randn(shape, generator=g).to(dtype), torch.randn(shape, generator=g).to(dtype)


def arena(n_pages: int, extra_bytes: int = 0, page_tokens: int = PAGE_TOKENS, geometry: KVGeometry = GEO) -> HostKVArena:
    page_bytes = page_tokens * geometry.bytes_per_token // geometry.n_layers
    return HostKVArena(geometry, n_pages * page_bytes + extra_bytes, page_tokens)


def test_bytes_per_token():
    assert GEO.bytes_per_token == 128
    assert arena(1).page_bytes == PAGE_BYTES == 256
    half = KVGeometry(n_layers=3, n_kv_heads=2, head_dim=8, n_q_heads=6, dtype=torch.bfloat16)
    assert half.bytes_per_token == 2 * 3 * 2 * 8 * 2


@pytest.mark.parametrize(
    "offload_bytes, n_pages",
    [(0, 0), (PAGE_BYTES - 1, 0), (PAGE_BYTES, 1), (3 * PAGE_BYTES + PAGE_BYTES - 1, 3), (5 * PAGE_BYTES, 5)],
)
def test_capacity_rounds_down_to_whole_pages(offload_bytes, n_pages):
    a = HostKVArena(GEO, offload_bytes, PAGE_TOKENS)
    assert a.page_bytes == PAGE_BYTES
    assert a.n_pages == n_pages
    assert a.capacity_bytes == n_pages * PAGE_BYTES <= offload_bytes
    assert (a.free_pages, a.used_pages) == (n_pages, 0)


@pytest.mark.parametrize("n_tokens, pages", [(0, 0), (1, 1), (3, 1), (4, 1), (5, 2), (8, 2), (9, 3), (16, 4), (17, 5)])
def test_pages_for(n_tokens, pages):
    a = arena(8)
    assert a.pages_for(n_tokens) == pages
    assert a.can_store(pages) == (pages <= 8)


@pytest.mark.parametrize("n_tokens", [1, 3, 4, 5, 8, 11, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_round_trip_is_exact(n_tokens, dtype):
    geo = KVGeometry(n_layers=2, n_kv_heads=2, head_dim=4, n_q_heads=2, dtype=dtype)
    a = arena(8, geometry=geo)
    keys, values = kv(n_tokens, seed=n_tokens, dtype=dtype)
    pages = a.store(keys, values)
    assert len(pages) == a.pages_for(n_tokens)
    k, v = a.load(pages, n_tokens, torch.device("cpu"))
    assert k.shape == v.shape == (2, n_tokens, 4)
    assert k.dtype == v.dtype == dtype
    assert torch.equal(k, keys) and torch.equal(v, values)


def test_store_copies():
    """The arena keeps its own copy: changing the source afterwards changes nothing stored."""
    a = arena(4)
    keys, values = kv(5, seed=1)
    ref_k, ref_v = keys.clone(), values.clone()
    pages = a.store(keys, values)
    keys.zero_()
    values.zero_()
    k, v = a.load(pages, 5, torch.device("cpu"))
    assert torch.equal(k, ref_k) and torch.equal(v, ref_v)


def test_exact_page_ids_and_reuse_after_free():
    a = arena(8)
    data = {}

    def store(n, seed):
        pages = a.store(*kv(n, seed))
        data[tuple(pages)] = (n, seed)
        return pages

    assert store(5, 0) == [0, 1]  # lowest pages first on a fresh arena
    assert store(4, 1) == [2]
    assert store(9, 2) == [3, 4, 5]
    assert (a.free_pages, a.used_pages) == (2, 6)
    a.free([0, 1])
    del data[(0, 1)]
    assert (a.free_pages, a.used_pages) == (4, 4)
    assert store(4, 3) == [0]  # the most recently freed pages come back first, in their order
    assert store(8, 4) == [1, 6]
    assert store(1, 5) == [7]
    assert a.free_pages == 0 and not a.can_store(1)
    # Reusing pages never touched the other blocks' data.
    for pages, (n, seed) in data.items():
        k, v = a.load(list(pages), n, torch.device("cpu"))
        ref_k, ref_v = kv(n, seed)
        assert torch.equal(k, ref_k) and torch.equal(v, ref_v)


def test_full_arena_raises_memory_error_and_changes_nothing():
    a = arena(3)
    kept = a.store(*kv(8, 0))  # 2 pages
    assert a.can_store(a.pages_for(4)) and not a.can_store(a.pages_for(5))
    with pytest.raises(MemoryError, match="need 2 pages, 1 free"):
        a.store(*kv(5, 1))
    assert (a.free_pages, a.used_pages) == (1, 2)
    assert a.store(*kv(4, 2)) == [2]
    k, _ = a.load(kept, 8, torch.device("cpu"))
    assert torch.equal(k, kv(8, 0)[0])


def test_zero_page_arena_refuses_everything():
    a = arena(0, extra_bytes=PAGE_BYTES - 1)
    assert a.n_pages == 0 and a.capacity_bytes == 0
    assert not a.can_store(a.pages_for(1))
    with pytest.raises(MemoryError):
        a.store(*kv(1, 0))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    page_tokens=st.sampled_from([1, 3, 4, 7]),
    n_pages=st.integers(0, 12),
    ops=st.lists(st.tuples(st.booleans(), st.integers(1, 15), st.integers(0, 10**6)), max_size=30),
)
def test_random_store_free_sequences_keep_pages_consistent(page_tokens, n_pages, ops):
    """free + used == n_pages; held blocks own disjoint pages; every held block reads back exactly."""
    a = arena(n_pages, page_tokens=page_tokens)
    held: list[tuple[list[int], int, int]] = []  # (pages, n_tokens, seed)
    for is_store, n, seed in ops:
        if is_store or not held:
            fits = a.can_store(a.pages_for(n))
            assert fits == (a.pages_for(n) <= a.free_pages)
            if fits:
                held.append((a.store(*kv(n, seed)), n, seed))
            else:
                with pytest.raises(MemoryError):
                    a.store(*kv(n, seed))
        else:
            pages, _, _ = held.pop(seed % len(held))
            a.free(pages)
        owned = [p for pages, _, _ in held for p in pages]
        assert len(owned) == len(set(owned))
        assert all(0 <= p < a.n_pages for p in owned)
        assert a.used_pages == len(owned)
        assert a.free_pages + a.used_pages == a.n_pages
    for pages, n, seed in held:
        assert len(pages) == a.pages_for(n)
        k, v = a.load(pages, n, torch.device("cpu"))
        ref_k, ref_v = kv(n, seed)
        assert torch.equal(k, ref_k) and torch.equal(v, ref_v)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the copy under test is device-to-host")
def test_round_trip_from_a_cuda_device_is_exact_when_read_at_once():
    """K/V stored from the GPU and read back at once are the values stored, in each of many pages.

    A non_blocking device-to-host copy returns before its data lands; storing from it let the
    arena keep pages that were still being written (seen only on a GPU, never on the CPU).
    Large pages make such a race visible: each store is read back before anything else runs.
    """
    geometry = KVGeometry(n_layers=2, n_kv_heads=8, head_dim=128, n_q_heads=8, dtype=torch.float32)
    page_tokens = 256
    a = arena(64, page_tokens=page_tokens, geometry=geometry)
    device = torch.device("cuda")
    g = torch.Generator(device=device).manual_seed(0)
    for i in range(16):
        keys = torch.randn((8, 1000, 128), generator=g, device=device) * (i + 1)
        values = torch.randn((8, 1000, 128), generator=g, device=device) - i
        pages = a.store(keys, values)
        k, v = a.load(pages, 1000, device)
        assert torch.equal(k, keys) and torch.equal(v, values), f"store {i}: pages differ from what was stored"
        a.free(pages)
