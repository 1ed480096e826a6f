"""``full``: attend to everything held, retrieve nothing.

The reference every other policy is tested against: while the stream fits in
``memory.budget_tokens``, encoding and answering are exactly a plain forward
over the whole sequence (tests/unit/test_engine_parity.py). Past the budget the
oldest frame is evicted, so memory stays bounded; there is no offload tier,
since a policy without retrieval could never read it back.
"""

from __future__ import annotations

from videokv_node.memory.policies.base import EncodeJob, MemoryPolicy, PolicyHost
from videokv_node.memory.context.selection import Static
from videokv_node.memory.store.block import FrameBlock, Tier
from videokv_node.memory.store.block_index import Candidates
from videokv_node.memory.store.block_store import BlockStore


class FullPolicy(MemoryPolicy):
    name = "full"
    uses_offload = False
    resident_context = True

    def encoding_context(self, store: BlockStore, job: EncodeJob) -> list[FrameBlock]:
        return list(store.blocks(Tier.RESIDENT))

    def select(self, host: PolicyHost, candidates: Candidates, question: str) -> Static:
        return Static.everywhere(candidates.blocks(), self.n_layers)
