"""Prefill and greedy decoding of a transformers decoder under the ``spava`` attention.

``ShardRunner`` is one rank of a job; ``OracleRunner`` the single-process
reference with the same API. Both take the decoder (e.g. Qwen2Model, its
sub-config switched to ``spava``) and its LM head, and the full input embeddings:
frame embeddings are gathered before the prefill (paper section 3.2: every host
has the whole sequence), so each rank slices its own tokens by the ``Layout``.

KV after the prefill (section 3.3 and the issue): a rank keeps its shard only:
its anchor slice, its two blocks and, on ``question_rank``, the question. The
shards partition the sequence, so each decoded token's attention is the
log-sum-exp merge of the ranks' partials; ``question_rank`` alone keeps new KV
(the others drop the step's keys right after it, with ``Cache.crop``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from transformers.cache_utils import DynamicCache

from videokv_node.spava.attention import ExactDecode, OraclePrefill
from videokv_node.spava.collectives import broadcast_tensor
from videokv_node.spava.config import SpavaConfig
from videokv_node.spava.layout import Layout
from videokv_node.spava.shard import ShardDecode, ShardPrefill


class _Runner:
    """What both runners share: decoder calls, logits and the greedy loop."""

    def __init__(self, decoder: torch.nn.Module, lm_head: torch.nn.Module, cfg: SpavaConfig) -> None:
        self.decoder, self.lm_head, self.cfg = decoder, lm_head, cfg
        self.cache: DynamicCache | None = None
        self.layout: Layout | None = None
        self.next_position = 0

    def _forward(self, embeds: torch.Tensor, positions: list[int] | torch.Tensor, call) -> torch.Tensor:
        """Run the decoder on (1, n, hidden) ``embeds``; returns the last token's logits (vocab,) in float32."""
        pos = torch.as_tensor(positions, device=embeds.device).view(1, -1)
        out = self.decoder(inputs_embeds=embeds, position_ids=pos, past_key_values=self.cache, use_cache=True, spava_call=call)
        return self.lm_head(out.last_hidden_state[:, -1]).float()[0]

    def _pick(self, logits: torch.Tensor) -> int:
        return int(logits.argmax())

    @torch.inference_mode()
    def generate(self, first_logits: torch.Tensor, embed, max_new_tokens: int, eos: set[int]) -> list[int]:
        """Greedy answer ids after the prefill; ``embed(ids) -> (1, n, hidden)``."""
        ids: list[int] = []
        logits = first_logits
        for _ in range(max_new_tokens):
            token = self._pick(logits)
            if token in eos:
                break
            ids.append(token)
            if len(ids) == max_new_tokens:
                break
            logits = self.decode(embed([token]))
        return ids


    @torch.inference_mode()
    def score_continuations(self, first_logits: torch.Tensor, embed, continuations: list[list[int]]) -> list[list[float]]:
        """log p of each token of each continuation as the answer after the prefill (natural log).

        Each continuation is fed token by token through ``decode`` (every rank in lockstep: the
        tokens are given, so no choice is broadcast), then the cache and the next position are
        cut back to the prefill's, so the continuations never see each other.
        """
        start, kept = self.next_position, self.cache.get_seq_length()
        out = []
        for cont in continuations:
            logits, lps = first_logits, []
            for i, token in enumerate(cont):
                lps.append(float(torch.log_softmax(logits.double(), dim=0)[token]))
                if i + 1 < len(cont):  # the last token's successor is never needed
                    logits = self.decode(embed([token]))
            extra = self.cache.get_seq_length() - kept  # a rank that kept the steps' KV drops it; the others kept none
            if extra:
                self.cache.crop(-extra)  # transformers 5: a negative count removes that many tokens
            self.next_position = start
            out.append(lps)
        return out


class OracleRunner(_Runner):
    """The single-process reference: the whole sequence under the structured mask, exact decoding."""

    def __init__(self, decoder, lm_head, cfg: SpavaConfig, world: int) -> None:
        super().__init__(decoder, lm_head, cfg)
        self.world = world

    @torch.inference_mode()
    def prefill(self, embeds: torch.Tensor, question_len: int) -> torch.Tensor:
        total = embeds.shape[1]
        self.layout = Layout.build(self.cfg, total, question_len, self.world)
        self.cache = DynamicCache()
        self.next_position = total
        return self._forward(embeds, list(range(total)), OraclePrefill(self.layout, self.cfg.pool_window))

    @torch.inference_mode()
    def decode(self, embeds: torch.Tensor) -> torch.Tensor:
        n = embeds.shape[1]
        logits = self._forward(embeds, list(range(self.next_position, self.next_position + n)), ExactDecode())
        self.next_position += n
        return logits


class ShardRunner(_Runner):
    """One rank of a Spava job on process group ``group`` (None: the default group)."""

    def __init__(self, decoder, lm_head, cfg: SpavaConfig, group=None) -> None:
        super().__init__(decoder, lm_head, cfg)
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)
        cfg.check_world(self.world)

    @torch.inference_mode()
    def prefill(self, embeds: torch.Tensor, question_len: int) -> torch.Tensor:
        """Prefill the full (1, T, hidden) ``embeds`` (identical on every rank); returns the question's last logits."""
        total = embeds.shape[1]
        lay = self.layout = Layout.build(self.cfg, total, question_len, self.world)
        positions = lay.local_positions(self.rank)
        local = embeds[:, positions]  # (1, n_local, hidden)
        self.cache = DynamicCache()
        logits = self._forward(local, positions, ShardPrefill(lay, self.cfg, self.group, self.rank))
        self._keep_shard(positions)
        self.next_position = total
        return logits

    def _keep_shard(self, positions: list[int]) -> None:
        """Drop from the cache what another rank holds: the anchor outside this rank's slice, and
        the question unless this is ``question_rank`` (the shards then partition the sequence)."""
        lay = self.layout
        s0, s1 = lay.anchor_slice(self.rank)
        owns_question = self.rank == self.cfg.question_rank
        keep = [i for i, p in enumerate(positions)
                if (s0 <= p < s1) or (lay.anchor_len <= p < lay.question_start) or (p >= lay.question_start and owns_question)]
        index = torch.tensor(keep, dtype=torch.long)
        shard = DynamicCache()
        for layer_idx, layer in enumerate(self.cache.layers):
            idx = index.to(layer.keys.device)
            shard.update(layer.keys.index_select(2, idx), layer.values.index_select(2, idx), layer_idx)  # (1, H_kv, n, D)
        self.cache = shard

    @torch.inference_mode()
    def decode(self, embeds: torch.Tensor) -> torch.Tensor:
        n = embeds.shape[1]
        call = ShardDecode(self.cfg, self.group, self.rank, self.world)
        logits = self._forward(embeds, list(range(self.next_position, self.next_position + n)), call)
        if not call.appends:
            self.cache.crop(-n)  # transformers 5: a negative count removes that many tokens
        self.next_position += n
        return logits

    def _pick(self, logits: torch.Tensor) -> int:
        """question_rank's choice, broadcast: ranks' logits may differ in the last bit, the answer may not."""
        token = logits.argmax().view(1).to(torch.long)  # on the logits' device: NCCL needs CUDA tensors
        return int(broadcast_tensor(token, self.cfg.question_rank, self.group, "decode: next token", self.cfg.timeout_s)[0])
