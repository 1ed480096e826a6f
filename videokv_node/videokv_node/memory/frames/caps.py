"""The caps: after every step that may add to memory, the resident budget is met again.

Which block leaves is the same for every policy (the oldest of its tier, ReKV's and every seed's rule), so it
is not a policy hook; what a policy decides is whether a block leaving the device is offloaded
(``uses_offload``), how many tokens per layer the store may hold (``resident_tokens``: HERMES' script budget)
and what it holds outside the store (StreamKV's cached open segment, ``open_segment``).
"""

from __future__ import annotations

from videokv_node.memory.context.encoding import EncodeJob
from videokv_node.memory.policies.base import MemoryPolicy
from videokv_node.memory.store.block import FrameBlock, Tier
from videokv_node.memory.store.block_store import BlockStore


def demotion_victim(store: BlockStore) -> FrameBlock:
    """The resident block to move off the device when over budget: the oldest."""
    victim = store.oldest(Tier.RESIDENT)
    if victim is None:
        raise RuntimeError("over the resident budget with no resident block: the budget is smaller than the sink")
    return victim


def offload_victim(store: BlockStore) -> FrameBlock:
    """The offloaded block to drop when the host arena is full: the oldest."""
    victim = store.oldest(Tier.OFFLOADED)
    if victim is None:
        raise RuntimeError("host arena full with no offloaded block")
    return victim


def enforce_caps(store: BlockStore, policy: MemoryPolicy, budget_tokens: int, sink_tokens: int, n_layers: int) -> None:
    """Demote or evict the oldest resident blocks until the resident budget holds (``budget_tokens`` tokens'
    worth, the sink's apart), offloading where the policy has an offload tier and the arena makes room by
    dropping its oldest; every block that leaves memory is counted by the store. The caller holds its lock."""
    segment = policy.open_segment()
    pending = segment.entries() if segment is not None else 0  # StreamKV's cached open segment, counted in the budget
    budget = policy.resident_tokens(budget_tokens, sink_tokens) * n_layers - pending
    # Never for the pending cache's sake demote the encoding window: the next frames' KV would depend on the caps.
    window = {b.block_id for b in policy.encoding_context(store, EncodeJob([]))} if pending else set()
    while store.resident_entries > budget:
        if pending and store.resident_entries <= budget + pending and (
            not store.count(Tier.RESIDENT) or demotion_victim(store).block_id in window
        ):
            break  # only the cache is over: documented in policies/streamkv.py
        victim = demotion_victim(store)
        if not (policy.uses_offload and store.can_offload(victim)):
            store.evict(victim)
            continue
        while not store.arena_has_room(victim):
            store.evict(offload_victim(store))
        store.offload(victim)
