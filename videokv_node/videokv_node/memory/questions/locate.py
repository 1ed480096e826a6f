"""Locate: the moments in memory most relevant to a text query, ranked without generating text.

Two rankings, chosen by the policy (``MemoryPolicy.locate_scores``):

- **retrieval** (a policy with retrieval scores of its own; ``rekv``): every candidate
  block scored as ReKV scores it for a question (``scoring/rekv.py`` ``layer_scores``), then
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

Either way one question prefill at most (before any re-ranking, below), and no decoding: retrieval runs the probe only;
a policy that selects by a probe of the text (StreamKV, MuKV) probes it before the prefill,
so the query's tokens pass the decoder twice there (tests/unit/test_locate.py counts them).
A block citing several frames (a segment, a merged frame) gives each of them its
score; a frame cited by several blocks (MuKV's frame and segment) keeps its best.

**Likelihood re-ranking** (``answer.locate_rerank`` N > 0, the default 8; not in any seed):
the best max(N, top_k) moments of the ranking above are scored again, each by the block it
got its score from, **alone**: the prompt sink, that block's kept tokens (placed as a question
would place them) and ``answer.locate_prompt`` ("What is in the image?") asked as an open
question, then the query's subject fed as the answer (``subject_of``: "Where did you last see the red
toolbox?" is scored as "the red toolbox"; any other query as given); the score is the mean
log-probability per token of those tokens (natural log, <= 0), the moments sorted by it (ties: the first
ranking's order) and the method named ``<first>+likelihood``. Why: neither ranking above reads
what a frame shows. ReKV's mean key and a prefill's attention mass are dominated by what all
frames share, so on videokv-tiny's needle frames they rank the same frames first for any query
(docs/BENCHMARKS.md, grounding); the model's own reading of one frame, asked to describe it,
gives the query's words a likelihood that does depend on the frame (generative retrieval by
query likelihood). Cost: the prompt and query tokens read over a context of one frame per shortlisted
moment, no decoding; moments whose blocks have one size are read ``REREAD_BATCH`` to a forward (each row
over its own block's cache, as if alone); it grows with N, not with the memory. The
shortlist still comes from the first ranking, so a frame it ranks below N is never re-scored, unless its
words name the query's thing (below).

**Words** (not in any seed; issue 34): a model that writes words into a frame's tokens (videokv-tiny v5's
nouns, ``VideoLLMAdapter.frame_words``) has them kept with the frame's block (``FrameBlock.words``). With
re-ranking on, the blocks whose words name the query's subject (``memory/store/words.py``: a word as whole
words of the subject, singular or plural, or a common synonym) join the shortlist, at most max(N, top_k),
one sighting at a time, the frame's most certain word first, then the newest (``words_shortlist``); the method is then
``<first>+words+likelihood``. Why: on real things ReKV's mean key shortlisted the same frames for every
query (docs/notes/2026-11-27-issue34-real-things.md), while the frame's own nouns say where the thing was; the
likelihood re-ranking still orders the union, so a wrong noun costs a re-read, not a wrong first answer
by itself. Without re-ranking words are not read (a first ranking's scores and theirs do not compare).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicCache

from videokv_node.memory.context.retrieval_cache import place_layer
from videokv_node.memory.policies.base import present_in
from videokv_node.memory.store.block import FrameBlock
from videokv_node.models.attention import attention_probs
from videokv_node.pose import Pose

METHODS = ("retrieval", "attention")  # the first ranking; "<method>+likelihood" when re-ranked
REREAD_BATCH = 8  # blocks re-read in one forward: bounds the logits held at once (8 x tokens x vocab)


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
    last_stamp_ns: int = 0  # a still span's last frame (memory.redundancy, issue 36); 0: none merged, stamp_ns is the last


@dataclass(slots=True)
class LocateResult:
    moments: list[Moment]  # best first, at most top_k
    method: str  # one of METHODS
    latency_s: float  # request start -> ranking done


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


def rank_moments(blocks: Sequence[FrameBlock], scores: Sequence[float], top_k: int,
                 sources: dict[tuple[int, str], FrameBlock] | None = None) -> list[Moment]:
    """One moment per (stamp, camera) cited by ``blocks``, scored by its best block, best first
    (ties: the newer first), at most ``top_k``. A summary token with no stamp cites none.
    ``sources``, if given, is filled with the block each moment got its score from."""
    best: dict[tuple[int, str], Moment] = {}
    for block, score in zip(blocks, scores, strict=True):
        if block.kind == "summary" and block.stamp_ns <= 0:
            continue
        for s in block.stamps_ns:
            key = (s, block.camera)
            m = best.get(key)
            if m is None or score > m.score:
                best[key] = Moment(s, block.camera, float(score), block.pose_at(s) or (m.pose if m else None))
                if sources is not None:
                    sources[key] = block
            elif m.pose is None:
                m.pose = block.pose_at(s)
            if block.last_stamp(s) != s:  # a still span: "when did you last see it" reads its end
                best[key].last_stamp_ns = max(best[key].last_stamp_ns, block.last_stamp(s))
    ranked = sorted(best.values(), key=lambda m: (-m.score, -m.stamp_ns, m.camera))
    return ranked[:top_k]


# A planner's question about where or when something was seen, and the request words around a thing:
# what the re-ranking strips to score the thing itself as a frame's description (``subject_of``).
_ASKING = re.compile(
    r"^(?:(?:can|could|would) you\s+)?(?:please\s+)?"
    r"(?:(?:where|when)\s+(?:did|have|had|do)\s+(?:you|we|i)\s+(?:last\s+|first\s+|ever\s+)?(?:see|seen|saw|spot|spotted|notice|noticed|find|found|observe|observed)"
    r"|(?:where|when)\s+(?:was|were|is|are)(?=\s)"
    r"|(?:did|have|had)\s+(?:you|we|i)\s+(?:ever\s+)?(?:see|seen|saw|spot|spotted|notice|noticed)"
    r"|(?:find|locate|show\s+me|look\s+for|search\s+for)(?=\s))\s+",
    re.IGNORECASE,
)
_TRAILING = re.compile(r"(?:\s+(?:last|lately|recently|before|earlier|today|please))*\s*[?.!]*\s*$", re.IGNORECASE)


def subject_of(text: str) -> str:
    """The thing a locate query asks for, as a frame's description would name it: "Where did you last see
    the red toolbox?" -> "the red toolbox"; "find a person" -> "a person". A query that is not a where/when/
    have-you-seen/find request, or that would be left empty, is returned stripped and otherwise as given
    ("What colour is the shape?", "the blue circle"). Why: the re-ranking scores the query as the model's
    description of a frame, and a frame is described by what it shows, not by the question asked of it."""
    text = text.strip()
    asked = _ASKING.match(text)
    if asked is None:
        return text
    thing = _TRAILING.sub("", text[asked.end():])
    return thing if thing else text


@torch.inference_mode()
def likelihood_scores(adapter, store, sink, policy, blocks: Sequence[FrameBlock], prompt: str, text: str) -> list[float]:
    """Per block, the mean log-probability per token (natural log) of the query ``text``'s subject
    (``subject_of``) as the answer to the open question ``prompt`` asked over the prompt sink and that
    block alone (its kept tokens in each layer, placed by ``policy.layout`` as for a question). Blocks
    that keep the same tokens per layer and are placed alike are read together, ``REREAD_BATCH`` at a
    time: one decoder forward of the prompt and the subject's tokens per batch, each row over its own
    block's cache (the rows share positions and mask, so each equals a forward of its block alone);
    the cache is dropped after it. Memory is not changed."""
    cont = adapter.text_ids(subject_of(text))
    feed = adapter.question_ids(prompt, []) + cont[:-1]  # the last token's successor is never needed
    embeds = adapter.embed_tokens(feed)
    n_layers = adapter.geometry.n_layers
    plans, groups = [], {}
    for i, block in enumerate(blocks):
        per_layer = present_in([block], n_layers)
        targets, next_pos = policy.layout(sink.n_tokens, per_layer)
        plans.append((per_layer, targets))
        shape = tuple(block.layer_tokens(l) if per_layer[l] else 0 for l in range(n_layers))
        groups.setdefault((shape, next_pos), []).append(i)
    out = [0.0] * len(blocks)
    picked = torch.tensor(cont, device=embeds.device)[:, None]  # the subject's tokens, where the logits are
    for (_, next_pos), members in groups.items():
        for at in range(0, len(members), REREAD_BATCH):
            rows = members[at:at + REREAD_BATCH]
            layers = []
            for l in range(n_layers):
                kv = [place_layer(adapter, store, sink, plans[i][0][l], plans[i][1][l], l) for i in rows]
                layers.append((torch.cat([k for k, _ in kv]), torch.cat([v for _, v in kv])))
            logits = adapter.forward(embeds.expand(len(rows), -1, -1), adapter.text_positions(next_pos, len(feed)),
                                     DynamicCache(ddp_cache_data=layers), n_logits=len(cont))
            logits = logits.reshape(len(rows), len(cont), -1)
            for row, i in enumerate(rows):  # one row at a time in float64: (n, vocab) each
                out[i] = float(torch.log_softmax(logits[row].double(), dim=-1).gather(1, picked).mean())
    return out


def with_named(moments: list[Moment], sources: dict[tuple[int, str], FrameBlock], named: Sequence[FrameBlock]) -> list[Moment]:
    """The moments of ``named`` (blocks whose words name the query's thing, in that order) that ``moments`` lacks,
    then ``moments``: the re-ranking's shortlist. ``sources`` gets each added moment's block (a moment of both
    keeps the first ranking's)."""
    found: dict[tuple[int, str], FrameBlock] = {}
    extra = rank_moments(named, [-float(i) for i in range(len(named))], sum(len(b.stamps_ns) for b in named), found)
    for key, block in found.items():
        sources.setdefault(key, block)
    seen = {(m.stamp_ns, m.camera) for m in moments}
    return [m for m in extra if (m.stamp_ns, m.camera) not in seen] + moments


def rerank_by_likelihood(moments: list[Moment], sources: dict[tuple[int, str], FrameBlock],
                         scores_of, top_k: int) -> list[Moment]:
    """``moments`` (best first) re-scored by ``scores_of(blocks)`` of the block each got its score from
    (each block scored once), best first (ties: the order given), at most ``top_k``."""
    blocks: dict[int, FrameBlock] = {}
    for m in moments:
        b = sources[(m.stamp_ns, m.camera)]
        blocks.setdefault(b.block_id, b)
    by_id = dict(zip(blocks, scores_of(list(blocks.values())), strict=True))
    rescored = [Moment(m.stamp_ns, m.camera, by_id[sources[(m.stamp_ns, m.camera)].block_id], m.pose, m.last_stamp_ns) for m in moments]
    return sorted(rescored, key=lambda m: -m.score)[:top_k]  # a stable sort: ties keep the order given

