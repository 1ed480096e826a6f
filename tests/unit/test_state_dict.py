"""State out and in, part by part: blocks, the block store and the engine's policy host.

Hand-made blocks in a tiny store (tests/unit/test_policies.py's), so each expected id, count and
tensor can be read off the test; the whole engine's round trip is in test_snapshot.py.
"""

from __future__ import annotations

import pytest
import torch

from tests.unit.test_policies import GEO, block, store_with
from videokv_node.memory import GenerationConfig, MemoryConfig, VideoMemoryEngine
from videokv_node.memory.store.block import FrameBlock, Tier
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.memory.config import POLICIES
from videokv_node.memory.policies.host import EngineHost


def oldest_offloaded(store: BlockStore) -> FrameBlock:
    return store.oldest(Tier.OFFLOADED)


def test_a_block_state_leaves_out_the_kv_and_rebuilds_the_block():
    b = block(3, n_tokens=5)
    state = b.state_dict()
    assert state["id"] == 3 and state["tier"] == "resident" and state["stamps_ns"] == [4 * 10**9]
    assert all(set(kv) == {"index", "logical"} for kv in state["layers"])  # K/V are the store's to add
    for kv, layer in zip(state["layers"], b.layers):
        kv.update(keys=layer.keys, values=layer.values)
    again = FrameBlock.from_state_dict(state)
    assert (again.block_id, again.stamps_ns, again.tier, again.n_tokens) == (3, (4 * 10**9,), Tier.RESIDENT, 5)
    assert all(torch.equal(x.keys, y.keys) and torch.equal(x.index, y.index) for x, y in zip(again.layers, b.layers))


@pytest.mark.parametrize("index, why", [
    (torch.tensor([1, 0]), "must ascend"),
    (torch.tensor([0, 5]), "must ascend"),  # past the block's 5 tokens
    (torch.tensor([], dtype=torch.long), "must ascend"),
])
def test_a_block_state_with_bad_kept_indices_is_refused(index, why):
    state = block(0, n_tokens=5).state_dict()
    n = index.numel()
    state["layers"][1] = {"index": index, "logical": torch.zeros(1, n, dtype=torch.long),
                          "keys": torch.zeros(2, n, 4), "values": torch.zeros(2, n, 4)}
    state["layers"][0] = None
    with pytest.raises(ValueError, match=why):
        FrameBlock.from_state_dict(state)


def test_a_block_state_keeping_nothing_is_refused():
    state = block(0).state_dict()
    state["layers"] = [None] * GEO.n_layers
    with pytest.raises(ValueError, match="keeps nothing in any layer"):
        FrameBlock.from_state_dict(state)


def test_the_store_round_trips_both_tiers_and_its_counts():
    store = store_with([4, 4, 8, 4], offloaded=2)
    store.evict(list(store.blocks())[3])  # counted: 1 block, 8 entries
    state = store.state_dict()
    assert [b["id"] for b in state["blocks"]] == [0, 1, 2] and (state["evicted_blocks"], state["evicted_entries"]) == (1, 8)
    other = BlockStore(GEO, torch.device("cpu"), offload_bytes=1 << 16, page_tokens=4)
    other.load_state_dict(state, oldest_offloaded)
    assert [(b.block_id, b.tier) for b in other.blocks()] == [(0, Tier.OFFLOADED), (1, Tier.OFFLOADED), (2, Tier.RESIDENT)]
    assert (other.resident_entries, other.offloaded_entries) == (store.resident_entries, store.offloaded_entries) == (16, 16)
    assert (other.evicted_blocks, other.evicted_entries) == (1, 8)
    for x, y in zip(store.blocks(), other.blocks()):
        for layer in range(GEO.n_layers):
            assert all(torch.equal(s, t) for s, t in zip(store.layer_kv(x, layer), other.layer_kv(y, layer)))


def test_the_store_gives_kv_only_of_the_blocks_asked_for():
    store = store_with([4, 4, 4], offloaded=1)
    seen = []

    def kv_for(states):
        seen.append([s["id"] for s in states])
        return [0, 2]

    state = store.state_dict(kv_for)
    assert seen == [[0, 1, 2]]  # every block's state first, K/V after
    has_kv = [all("keys" in kv for kv in b["layers"] if kv is not None) for b in state["blocks"]]
    assert has_kv == [True, False, True]
    assert torch.equal(state["blocks"][0]["layers"][0]["keys"], torch.full((2, 4, 4), 0.0))  # offloaded: from the arena
    assert state["blocks"][0]["layers"][0]["keys"].device.type == "cpu"


def test_a_smaller_arena_evicts_the_policys_victims_on_load():
    store = store_with([4, 4, 4], offloaded=3)
    small = BlockStore(GEO, torch.device("cpu"), offload_bytes=4 * GEO.bytes_per_token // GEO.n_layers * 4, page_tokens=4)
    small.load_state_dict(store.state_dict(), oldest_offloaded)  # room for 4 pages: two blocks of 2 layers x 1 page
    assert [b.block_id for b in small.blocks()] == [1, 2] and small.evicted_blocks == 1 and small.evicted_entries == 8


@pytest.mark.parametrize("policy", POLICIES)
def test_a_policy_is_handed_the_narrow_host_never_the_engine(tiny_adapter, policy):
    T, sink = tiny_adapter.tokens_per_frame, len(tiny_adapter.prefix_ids())
    e = VideoMemoryEngine(tiny_adapter, MemoryConfig(policy=policy, budget_tokens=sink + 20 * T, local_window_tokens=T),
                          GenerationConfig())
    assert isinstance(e.host, EngineHost) and e.host.store is e.store and e.host.sink is e.sink
    assert not any(isinstance(v, VideoMemoryEngine) for v in vars(e.policy).values())
    if policy in ("hermes", "streamkv"):  # the two that need the engine after setup keep the host
        assert e.policy.host is e.host
