"""Locate: the moments in memory most relevant to a text query, ranked without generating text.

Two rankings, chosen by the policy (``MemoryPolicy.locate_scores``):

- **retrieval** (a policy with retrieval scores of its own; ``rekv``): every candidate
  block scored as ReKV scores it for a question, ``layer_scores`` below, then
  **averaged over the decoder layers**. ReKV picks its top-k per layer; a ranking over
  all frames needs one number per frame, and the mean over layers keeps the unit of
  ReKV's score (a scaled query-key dot product, the attention logit) and weighs every
  layer alike. The query is the text's pre-RoPE queries read right after the prompt
  sink (``VideoMemoryEngine.probe``): a short prefill of the query's tokens only.
  Departure from ReKV, where each layer's query comes from the question's prefill over
  the retrieved context: that would make the scores of layer l depend on what layers
  < l retrieved, and so not comparable across all frames; here all frames are scored
  by the same queries. No chat template around the query (the probe's raw text).
  With ``memory.rekv.selection: shared`` the score is instead the fused rank score a
  question retrieves by (the mean over layers of 1 / (1 + the block's rank in the layer),
  in (0, 1]; ``BlockIndex.fused_top_k``): on SmolLM2's 160-frame needle streams it put
  the needles among its top 16 about twice as often as the mean of the scores
  (docs/POLICIES.md); on 30-frame streams locate found them no better (docs/BENCHMARKS.md,
  grounding).
- **attention** (every other policy): one prefill of the query, as an open question,
  over the context the policy assembles for a question (``engine._prefill``); each
  frame's score is the attention mass its tokens receive, averaged over the query's
  tokens and the query heads in each layer, then over the layers (a frame absent from
  a layer counts 0 there). Scores lie in [0, 1]; the rest of the mass goes to the
  prompt sink and the query itself. Frames outside the policy's question context get
  no score and are not returned (fewer than ``top_k`` moments then).

Either way one question prefill at most, and no decoding: retrieval runs the probe only;
a policy that selects by a probe of the text (StreamKV, MuKV) probes it before the prefill,
so the query's tokens pass the decoder twice there (tests/unit/test_locate.py counts them).
A block citing several frames (a segment, a merged frame) gives each of them its
score; a frame cited by several blocks (MuKV's frame and segment) keeps its best.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from videokv_node.memory.block import FrameBlock
from videokv_node.models.attention import attention_probs
from videokv_node.pose import Pose

METHODS = ("retrieval", "attention")


@dataclass(slots=True)
class LocateQuery:
    text: str  # what to look for
    top_k: int  # moments wanted, >= 1
    cameras: list[str] = field(default_factory=list)  # empty: all cameras
    since_ns: int = 0  # 0: from the oldest memory
    until_ns: int = 0  # 0: up to now


@dataclass(slots=True)
class Moment:
    stamp_ns: int  # header stamp of the frame
    camera: str
    score: float  # the ranking's score (LocateResult.method says which)
    pose: Pose | None = None  # the robot's pose then, if the frame came with one


@dataclass(slots=True)
class LocateResult:
    moments: list[Moment]  # best first, at most top_k
    method: str  # one of METHODS
    latency_s: float  # request start -> ranking done


def query_means(queries: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """(L, n, H_q, D) queries -> (L, H_kv, D): mean over the tokens, then over the query heads of each
    KV group (GQA), as ``retrieval_cache.QueryCapture.mean`` reduces a question's queries for ReKV."""
    L, _, H_q, D = queries.shape
    return queries.float().mean(1).view(L, n_kv_heads, H_q // n_kv_heads, D).mean(2)


def layer_scores(q_means: torch.Tensor, key_means: torch.Tensor) -> torch.Tensor:
    """ReKV's block score in every layer: (L, H_kv, D) query means, (N, L, H_kv, D) block key means
    -> (N, L), score = mean over KV heads of q_h . k_h / sqrt(D) (``retrieval_cache.top_k_blocks``)."""
    H, D = key_means.shape[2], key_means.shape[3]
    return torch.einsum("lhd,nlhd->nl", q_means.float(), key_means.float()) / (H * math.sqrt(D))


class AttentionMass:
    """An attention observer: per layer, the mass each context key gets from the query's tokens,
    averaged over those tokens and the query heads ((K_ctx,) float32 on the host)."""

    def __init__(self) -> None:
        self.per_layer: dict[int, torch.Tensor] = {}

    def __call__(self, layer: int, query: torch.Tensor, key: torch.Tensor, scale: float) -> None:
        probs = attention_probs(query, key, scale)  # (H_q, q, K): the q query tokens come last in K
        n_ctx = key.shape[2] - query.shape[2]
        self.per_layer[layer] = probs[:, :, :n_ctx].mean(dim=(0, 1)).cpu()

    # The engine's question-stage protocol (``_prefill`` calls observer() and evict()).
    def observer(self, sink_len: int, n_question: int) -> "AttentionMass":
        return self

    def evict(self, cache) -> None:
        """Nothing is evicted: the prefill's cache is dropped right after."""


def block_masses(mass: AttentionMass, layer_blocks: Sequence[Sequence[int]], blocks: dict[int, FrameBlock],
                 sink_len: int) -> dict[int, float]:
    """Per block id, its tokens' attention mass summed in each layer, averaged over all layers.

    ``layer_blocks[l]`` are the block ids of layer l's cache after the sink, in cache order;
    each block holds ``layer_tokens(l)`` keys there.
    """
    n_layers = len(layer_blocks)
    totals: dict[int, float] = {}
    for layer, ids in enumerate(layer_blocks):
        m = mass.per_layer[layer]
        at = sink_len
        for bid in ids:
            t = blocks[bid].layer_tokens(layer)
            totals[bid] = totals.get(bid, 0.0) + float(m[at:at + t].sum())
            at += t
        if at != m.numel():
            raise RuntimeError(f"layer {layer}: {at} context keys planned, the pass saw {m.numel()}")
    return {bid: total / n_layers for bid, total in totals.items()}


def rank_moments(blocks: Sequence[FrameBlock], scores: Sequence[float], top_k: int) -> list[Moment]:
    """One moment per (stamp, camera) cited by ``blocks``, scored by its best block, best first
    (ties: the newer first), at most ``top_k``. A summary token with no stamp cites none."""
    best: dict[tuple[int, str], Moment] = {}
    for block, score in zip(blocks, scores, strict=True):
        if block.kind == "summary" and block.stamp_ns <= 0:
            continue
        for s in block.stamps_ns:
            key = (s, block.camera)
            m = best.get(key)
            if m is None or score > m.score:
                best[key] = Moment(s, block.camera, float(score), block.pose_at(s) or (m.pose if m else None))
            elif m.pose is None:
                m.pose = block.pose_at(s)
    ranked = sorted(best.values(), key=lambda m: (-m.score, -m.stamp_ns, m.camera))
    return ranked[:top_k]
