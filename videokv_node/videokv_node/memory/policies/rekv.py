"""``rekv``: the baseline of all seed papers (Di et al., ICLR 2025, "ReKV").

- Encoding: sliding-window attention. Each new frame attends to the prompt sink
  and the most recent frames that fit in ``memory.local_window_tokens``.
- Storage: one KV block per frame. Blocks leave the device oldest first when
  the resident budget is exceeded and go to the host arena (ReKV offloads to
  CPU RAM); past the arena's cap the oldest offloaded block is evicted.
- Question: per layer, the top ``memory.retrieve_frames`` blocks by the dot
  product of the question's mean query with the block's mean key, plus the
  recent frames (the local window among the candidates) always; in time order,
  re-rotated to consecutive positions after the sink.

Choices where the paper is not specific: scores use pre-RoPE queries and keys
(ReKV's InfLLM-derived retrieval is position-agnostic), averaged over the query
heads of each KV group and then over groups; retrieval happens inside the
question's single prefill pass, each layer using its own query (see
``memory/retrieval_cache.py``), as ReKV's in-attention retrieval does.
"""

from __future__ import annotations

from videokv_node.memory.block import FrameBlock
from videokv_node.memory.block_index import Candidates
from videokv_node.memory.block_store import BlockStore
from videokv_node.memory.policy import EncodeJob, MemoryPolicy, Probe, QuestionSelection, recent_resident, recent_within


class ReKVPolicy(MemoryPolicy):
    name = "rekv"
    uses_offload = True

    def encoding_context(self, store: BlockStore, job: EncodeJob) -> list[FrameBlock]:
        return recent_resident(store, self.config.local_window_tokens)

    def question_selection(self, store: BlockStore, candidates: list[FrameBlock], probe: Probe, question: str) -> QuestionSelection:
        recent = recent_within(candidates, self.config.local_window_tokens)
        recent_ids = {b.block_id for b in recent}
        pool = [b for b in candidates if b.block_id not in recent_ids]
        return QuestionSelection(fixed=recent, pool=pool, k=self.config.retrieve_frames)

    def select(self, store: BlockStore, candidates: Candidates, probe: Probe, question: str) -> QuestionSelection:
        """``question_selection`` on the index: the window from the newest candidates, the pool as a mask
        (scored per layer on the index inside the pass, ``BlockIndex.top_k``)."""
        recent = candidates.recent_within(self.config.local_window_tokens)
        return QuestionSelection(fixed=recent, pool_set=candidates.without(recent), k=self.config.retrieve_frames)
