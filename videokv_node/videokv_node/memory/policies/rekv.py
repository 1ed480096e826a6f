"""``rekv``: the baseline of all seed papers (Di et al., ICLR 2025, "ReKV").

- Encoding: sliding-window attention. Each new frame attends to the prompt sink
  and the most recent frames that fit in ``memory.local_window_tokens``.
- Storage: one KV block per frame. Blocks leave the device oldest first when
  the resident budget is exceeded and go to the host arena (ReKV offloads to
  CPU RAM); past the arena's cap the oldest offloaded block is evicted.
- Question: per layer, the top ``memory.retrieve_frames`` blocks by the dot
  product of the question's mean query with the block's mean key, plus (robot,
  ``memory.rekv.question_window``) the recent frames (the local window among the
  candidates) always; in time order, re-rotated to consecutive positions after
  the sink. The mean query is over the whole prompt (robot) or, as ReKV's code,
  over the question's own tokens (``memory.rekv.query: question``, the paper
  preset, which also drops the recent window: init tokens + top-k of all blocks).
  ReKV runs the question alone in a retrieval pass and then the prompt on the
  retrieved cache (which keeps the question's KV); here the retrieval happens in
  the prompt's one pass, the mean taken over the question's rows of it.

Shared selection (``memory.rekv.selection: shared``; ours, not ReKV's: the robot default, the paper
preset keeps ``layer``, ReKV's per-layer retrieval inside the pass): one
set of top ``memory.retrieve_frames`` blocks attended in every layer, chosen before the pass.
Every pool block is scored in every layer as above, with the question's queries read by the
probe (the question's text right after the prompt sink: ReKV's own retrieval pass also runs
the question alone), each layer ranks the blocks, and the rankings are fused by the mean over
layers of 1 / (1 + rank) (``BlockIndex.fused_top_k``). Why: on SmolLM2's 160-frame needle
streams ReKV's per-layer top-k finds a needle in some layer for most questions but in only
14-17% of the layers (docs/BENCHMARKS.md, issue 15), so few layers read it; a set shared by
all layers is read by all. Reciprocal ranks, not the mean score, because the layers' score
scales differ and a few layers would decide alone. Costs one probe prefill of the question.

Re-ranking (``memory.rekv.rerank`` N > 0, with ``selection: shared``; ours, not ReKV's, off in both
presets): the fused ranking's best N x ``retrieve_frames`` blocks are shortlisted; its first
``rerank_keep`` of ``retrieve_frames`` (rounded) are kept in that order, and the rest are the
shortlist's others best by the question's likelihood about each read alone (``PolicyHost.read_alone``:
``~/locate``'s re-ranking, memory/questions/locate.py). Why: the mean key of a frame does not single out
the frame a question names (SmolLM2's text needles: docs/BENCHMARKS.md, issue 15); the model's reading
of one frame does when the question names its subject, and misleads when it does not ("What colour is
the shape?" on videokv-tiny), which the kept share guards. Costs one short read per re-read block
(N x ``retrieve_frames`` minus the kept; blocks of one size batched), over the prompt sink and that block:
bounded by N, not by the memory.

Contrast (``memory.rekv.contrast`` w > 0, with ``selection: shared`` and for ``~/locate``; ours, not
ReKV's): each block is scored by its mean key less the mean of its w neighbours on each side in time
(``BlockIndex.contrasted_key_means``, ``scoring/contrast.py``). Why: on an hour of real footage the mean
key is decided by the shot a frame belongs to, and a thing seen in one or two frames of a shot never
ranked among the retrieved (issue 32; docs/POLICIES.md, "rekv: temporal contrast"). The paper preset
keeps ReKV's own mean key (0).

Choices where the paper is not specific: scores use pre-RoPE queries and keys
(ReKV's InfLLM-derived retrieval is position-agnostic), averaged over the query
heads of each KV group and then over groups; retrieval happens inside the
question's single prefill pass, each layer using its own query (see
``memory/context/retrieval_cache.py``), as ReKV's in-attention retrieval does.

Ingest (ours, exact): up to ``memory.prefill_batch`` queued frames are prefilled in one decoder
pass, each seeing only the sink, its own sliding window and itself at the positions it would have
alone (``memory/context/batch_prefill.py``): the same blocks as frame by frame, one weight read.

Words (``memory.rekv.words`` s > 0; ours, not ReKV's: the robot default 0.5, the paper preset 0): up to
ceil(s x ``retrieve_frames``) of the pool are the blocks whose words the question names (a model that writes
words into its frames, videokv-tiny v5's nouns: ``FrameBlock.words``, ``memory/store/words.py``), attended in every
layer beside the recent window; ReKV retrieves the rest of ``retrieve_frames`` from the others as above. Why:
ReKV's mean key does not single out the frames of a thing (issue 34: on real things ``~/locate``'s ReKV
shortlist held the same frames for every query), the frame's own nouns do. A question naming no word of any
frame retrieves as ReKV does.

Locate (``~/locate``, not in ReKV): every candidate's per-layer score above, for the
query's probe (queries read after the prompt sink), averaged over layers
(``memory/questions/locate.py`` says why); with ``selection: shared``, the fused rank score the
question retrieves by, so ``~/locate`` ranks the moments as a question would choose them.
"""

from __future__ import annotations

import math

import torch

from videokv_node.memory.store.block import FrameBlock
from videokv_node.memory.store.block_index import Candidates
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.memory.scoring.queries import query_means
from videokv_node.memory.scoring.rekv import fused_ranks, layer_scores
from videokv_node.memory.policies.base import EncodeJob, MemoryPolicy, PolicyHost, recent_resident
from videokv_node.memory.context.selection import InPass, Selection, Static
from videokv_node.memory.store.words import words_shortlist
from videokv_node.memory.scoring.top_k import top_k_stable


class ReKVPolicy(MemoryPolicy):
    name = "rekv"
    uses_offload = True

    def encoding_context(self, store: BlockStore, job: EncodeJob) -> list[FrameBlock]:
        # Departure P13 (docs/POLICIES.md): the window counts whole frames (15000 tokens: 76 LLaVA-OV
        # frames, 14,896 tokens); ReKV's code keeps the last n_local tokens, part of a 77th frame included.
        return recent_resident(store, self.config.local_window_tokens)

    def batch_window(self) -> int:
        """Frames may be prefilled together: the window is the newest resident blocks, no compression,
        and the budget holds the sink, the window and a frame with the oldest demoted first."""
        return self.config.local_window_tokens

    def select(self, host: PolicyHost, candidates: Candidates, question: str) -> Selection:
        """The recent window from the newest candidates (robot), and the rest as a pool: scored per layer on
        the index inside the pass (``InPass``: ``layer``, ReKV's), or once for all layers before it
        (``Static``: ``shared``, ``BlockIndex.fused_top_k``), its shortlist re-read (``rerank``)."""
        rekv = self.config.rekv
        # paper (question_window off): ReKV's retrieved cache is the init tokens and the top-k blocks of all.
        recent = candidates.recent_within(self.config.local_window_tokens) if rekv.question_window else []
        pool = candidates.without(recent)
        named = self._named(host, pool, question)  # memory.rekv.words: blocks whose words the question names
        pool, recent, k = pool.without(named), recent + named, self.config.retrieve_frames - len(named)
        if rekv.selection != "shared":
            return InPass(tuple(recent), pool, k, rekv.query)
        # Chosen before the pass, so no in-pass query (``rekv.query``) is read.
        if not pool.count or not k:  # nothing to rank: no probe
            return Static.everywhere(recent, self.n_layers)
        q = query_means(host.probe(question), self.adapter.geometry.n_kv_heads)  # (L, H_kv, D)
        index = host.store.index
        ranked = index.blocks_of(index.fused_top_k(q, pool.mask, k * max(1, rekv.rerank), rekv.contrast))  # best first
        keep = round(rekv.rerank_keep * k)  # the rest is read alone by the question's likelihood
        if not rekv.rerank or len(ranked) <= k or keep >= k:
            return Static.everywhere(recent + ranked[:k], self.n_layers)
        return Static.everywhere(recent + ranked[:keep] + self._reread(host, ranked[keep:], question, k - keep), self.n_layers)

    def _named(self, host: PolicyHost, pool: Candidates, question: str) -> list[FrameBlock]:
        """At most ``memory.rekv.words`` x ``retrieve_frames`` (rounded up) of ``pool`` whose words the question
        names, found by the store's word index (``BlockStore.words``) and ordered as ``~/locate`` orders them
        (``memory/store/words.py`` ``words_shortlist``)."""
        limit = math.ceil(self.config.rekv.words * self.config.retrieve_frames)
        named = host.store.words.named(question) if limit and pool.count and len(host.store.words) else {}
        if not named:
            return []
        index = host.store.index
        slots = torch.tensor([index.slot_of[i] for i in named], device=pool.mask.device)
        inside = [b for b, keep in zip(index.blocks_of(slots), pool.mask[slots].tolist()) if keep]
        return words_shortlist(inside, question, limit)

    @staticmethod
    def _reread(host: PolicyHost, shortlist: list[FrameBlock], question: str, k: int) -> list[FrameBlock]:
        """The ``k`` of ``shortlist`` the question's likelihood about each read alone puts first (ties: the
        shortlist's order, the fused ranking's): ``memory.rekv.rerank``."""
        scores = torch.tensor(host.read_alone(shortlist, question), dtype=torch.float64)  # (n,) mean log-probabilities
        return [shortlist[i] for i in top_k_stable(scores, k).tolist()]

    def locate_scores(self, host: PolicyHost, candidates: list[FrameBlock], text: str) -> torch.Tensor | None:
        if not candidates:
            return None
        q = query_means(host.probe(text), self.adapter.geometry.n_kv_heads)  # (L, H_kv, D)
        if w := self.config.rekv.contrast:  # every candidate against its neighbours, as a question ranks them
            index = host.store.index
            slots = torch.tensor([index.slot_of[b.block_id] for b in candidates], device=index.device)
            scores = index.layer_scores(slots, q.to(index.device), w).T.to(q.device)  # (N, L)
        else:
            key_means = torch.stack([b.key_mean for b in candidates]).to(q.device)  # (N, L, H_kv, D); kept on the host
            scores = layer_scores(q, key_means)  # (N, L)
        if self.config.rekv.selection == "shared":  # the ranking a question retrieves by
            absent = torch.tensor([[layer is None for layer in b.layers] for b in candidates], device=scores.device)
            ids = torch.tensor([b.block_id for b in candidates], device=scores.device)
            return fused_ranks(scores.masked_fill(absent, float("-inf")).T, ids)
        return scores.mean(dim=1)  # (N,)
