"""The attention of one rank in a Spava job: what replaces one decoder layer's attention on that rank.

Called once per layer with the rank's local queries, keys and values (post-RoPE),
local order [anchor | block a | block b | question] (``Layout.local_ranges``).
Fused forward (appendix B.1): context and question go through the layer in one
pass. Order of work (appendix B.3, figure 5), each collective waited for as late
as possible:

1. score the two local blocks against the question's mean query and start the
   all-gather of their passing keys/values;
2. attend the question to this rank's share of the keys (its anchor slice, its
   two blocks; the question itself only on ``question_rank``, causally) and start
   the all-gather of that partial (out, lse);
3. anchor rows (causal), then stage 1 of each block: anchor + itself causally;
4. wait for the passing blocks; stage 2 of each block: the passing keys of all
   earlier virtual blocks, merged with stage 1 by log-sum-exp;
5. wait for the question partials; merge them in rank order (the same order on
   every rank, so every rank holds the same question rows).

Decoding (``ShardDecode``): each rank keeps its KV shard (see ``runner``), each new
token's partial attention is all-gathered and merged; ``question_rank`` alone keeps
the new KV. Sizes come from the ``Layout``; the rank and group are fixed when the
call object is built, never looked up inside a layer.
"""

from __future__ import annotations

import torch

from videokv_node.spava.collectives import PendingGather
from videokv_node.spava.config import SpavaConfig
from videokv_node.spava.kernels import attend, causal_mask
from videokv_node.spava.layout import Layout
from videokv_node.spava.merge import merge_all, merge_pair
from videokv_node.spava.selection import mean_question_query, select_passing


class ShardPrefill:
    """Spava prefill attention of rank ``rank`` of ``group`` (``world`` ranks) for one ``layout``."""

    def __init__(self, layout: Layout, cfg: SpavaConfig, group, rank: int) -> None:
        self.layout, self.cfg, self.group, self.rank = layout, cfg, group, rank
        self.world = layout.world
        self.blocks = layout.blocks_of(rank)
        self.max_pass = max(layout.passing_of(u) for u in range(layout.n_virtual))

    def _gather(self, what: str, layer: int, tensor: torch.Tensor) -> PendingGather:
        return PendingGather(f"layer {layer}: {what}", tensor, self.group, self.world, self.rank, self.cfg.timeout_s, self.cfg.overlap)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """q (H_q, n_local, D), k/v (H_kv, n_local, D) -> attention output (H_q, n_local, D)."""
        lay = self.layout
        h_kv, n_local, d = k.shape
        a, nq = lay.anchor_len, lay.question_len
        lens = [lay.block_len(b) for b in self.blocks]
        starts = [a, a + lens[0]]  # local start of each held block
        qs = n_local - nq  # local start of the question
        if qs != a + sum(lens):
            raise ValueError(f"rank {self.rank}: {n_local} local tokens do not match the layout ({a}+{lens}+{nq})")
        blk = [slice(s, s + n) for s, n in zip(starts, lens)]

        # 1. passing keys of the two held blocks, padded to the longest passing block of the job.
        mean_q = mean_question_query(q[:, qs:], h_kv)
        send = k.new_zeros((2, 2, h_kv, self.max_pass, d))  # (block, k|v, H_kv, P_max, D)
        for i, b in enumerate(self.blocks):
            idx = select_passing(mean_q, k[:, blk[i]], lay.passing_of(b), self.cfg.pool_window)  # (H_kv, p)
            p = idx.shape[1]
            gather_idx = idx[..., None].expand(h_kv, p, d)
            send[i, 0, :, :p] = torch.gather(k[:, blk[i]], 1, gather_idx)
            send[i, 1, :, :p] = torch.gather(v[:, blk[i]], 1, gather_idx)
        passing = self._gather("passing blocks", layer, send)

        # 2. the question against this rank's share of the keys.
        s0, s1 = lay.anchor_slice(self.rank)
        parts_k = [k[:, s0:s1], k[:, a:qs]]
        parts_v = [v[:, s0:s1], v[:, a:qs]]
        m_ctx = (s1 - s0) + (qs - a)
        owns_question = self.rank == self.cfg.question_rank
        if owns_question:
            parts_k.append(k[:, qs:])
            parts_v.append(v[:, qs:])
            mask = causal_mask(nq, m_ctx + nq, k.device)
        else:
            mask = None  # the question's own keys are elsewhere: nothing here is in its future
        q_out, q_lse = attend(q[:, qs:], torch.cat(parts_k, 1), torch.cat(parts_v, 1), scale, mask)
        question = self._gather("question partials", layer, torch.cat([q_out, q_lse[..., None]], dim=-1))

        # 3. anchor rows, stage 1 of each block.
        outs = [attend(q[:, :a], k[:, :a], v[:, :a], scale, causal_mask(a, a, k.device))[0]]
        stage1 = []
        for i in range(2):
            kk = torch.cat([k[:, :a], k[:, blk[i]]], 1)
            vv = torch.cat([v[:, :a], v[:, blk[i]]], 1)
            stage1.append(attend(q[:, blk[i]], kk, vv, scale, causal_mask(lens[i], a + lens[i], k.device)))

        # 4. stage 2: passing keys of every earlier virtual block.
        gathered = passing.wait()  # per rank: (2, 2, H_kv, P_max, D)
        for i, b in enumerate(self.blocks):
            earlier = [self._passed(gathered, u) for u in range(b)]
            kp = torch.cat([e[0] for e in earlier], 1) if earlier else k.new_zeros((h_kv, 0, d))
            vp = torch.cat([e[1] for e in earlier], 1) if earlier else v.new_zeros((h_kv, 0, d))
            out2, lse2 = attend(q[:, blk[i]], kp, vp, scale)
            outs.append(merge_pair(*stage1[i], out2, lse2)[0])

        # 5. question: merge every rank's partial, in rank order.
        partials = [(t[..., :-1], t[..., -1]) for t in question.wait()]
        outs.append(merge_all(partials)[0])
        return torch.cat([o.to(outs[-1].dtype) for o in outs], dim=1)

    def _passed(self, gathered: list[torch.Tensor], u: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Passing (keys, values) (H_kv, p_u, D) of virtual block ``u`` out of the gathered tensors."""
        owner = self.layout.rank_of_block(u)
        slot = self.layout.blocks_of(owner).index(u)
        p = self.layout.passing_of(u)
        t = gathered[owner][slot]
        return t[0, :, :p], t[1, :, :p]


class ShardDecode:
    """Decoding attention of one rank: exact attention over the union of all ranks' KV shards."""

    def __init__(self, cfg: SpavaConfig, group, rank: int, world: int) -> None:
        self.cfg, self.group, self.rank, self.world = cfg, group, rank, world
        self.appends = rank == cfg.question_rank

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """q (H_q, n, D) new tokens; k/v (H_kv, m, D) this rank's cache with the n new keys at the end."""
        n, m = q.shape[1], k.shape[1]
        if self.appends:
            out, lse = attend(q, k, v, scale, causal_mask(n, m, k.device))
        else:  # the new keys are dropped from this rank's cache after the step (runner)
            out, lse = attend(q, k[:, : m - n], v[:, : m - n], scale)
        pending = PendingGather(f"layer {layer}: decode partials", torch.cat([out, lse[..., None]], -1),
                                self.group, self.world, self.rank, self.cfg.timeout_s, overlap=False)
        return merge_all((t[..., :-1], t[..., -1]) for t in pending.wait())[0]
