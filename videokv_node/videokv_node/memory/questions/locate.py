"""Locate: the moments in memory most relevant to a text query, ranked without generating text.

Two rankings, chosen by the policy (``MemoryPolicy.locate_scores``):

- **retrieval** (a policy with retrieval scores of its own; ``rekv``): every candidate
  block scored as ReKV scores it for a question (``scoring/rekv.py`` ``layer_scores``), then
  **averaged over the decoder layers**. ReKV picks its top-k per layer; a ranking over
  all frames needs one number per frame, and the mean over layers keeps the unit of
  ReKV's score (a scaled query-key dot product, the attention logit) and weighs every
  layer alike. The query is the text's pre-RoPE queries read right after the prompt
  sink (``ModelRunner.probe``, memory/context/model_runner.py): a short prefill of the query's tokens only.
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
  over the context the policy assembles for a question (``QuestionReader.prefill``); each
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
moment, no decoding; moments whose blocks have one size are read ``REREAD_BATCH`` to a forward (``memory/context/model_runner.py``) (each row
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

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from videokv_node.memory.policies.base import MemoryPolicy, PolicyHost
from videokv_node.memory.question import Question, RequestError
from videokv_node.memory.questions.attention_mass import AttentionMass
from videokv_node.memory.questions.question_reader import QuestionReader
from videokv_node.memory.records.engine_settings import EngineSettings
from videokv_node.memory.records.clock import elapsed_s
from videokv_node.memory.store.block import FrameBlock
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.memory.store.words import subject_of, words_shortlist
from videokv_node.pose import Pose

METHODS = ("retrieval", "attention")  # the first ranking; "<method>+likelihood" when re-ranked
ReadAlone = Callable[[list[FrameBlock], str], list[float]]  # PolicyHost.read_alone


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


class Locator:
    """``~/locate`` over the engine's memory (its thread only): the ranking above, then the re-reading.
    Reads memory, never changes it; refuses (RequestError) what a question would refuse."""

    def __init__(self, reader: QuestionReader, policy: MemoryPolicy, host: PolicyHost, store: BlockStore,
                 settings: EngineSettings) -> None:
        self.reader, self.policy, self.host, self.store, self.settings = reader, policy, host, store, settings

    @torch.inference_mode()
    def locate(self, query: LocateQuery, read_alone: ReadAlone) -> LocateResult:
        """The ``query.top_k`` moments most relevant to ``query.text``, no text generated: the policy's retrieval
        scores, else one question prefill's attention mass; then (``answer.locate_rerank`` > 0) the best, and the
        blocks whose words name the query's thing, re-ranked by ``read_alone`` (the query's likelihood about each
        alone). Refuses (RequestError, nothing changed) an empty query, top_k < 1, a bad window, too long a query,
        or no frames to rank."""
        t0, answer = time.perf_counter(), self.settings.generation.answer
        if query.top_k < 1:
            raise RequestError(f"top_k must be at least 1, got {query.top_k}")
        question = Question(query.text, cameras=list(query.cameras), since_ns=query.since_ns, until_ns=query.until_ns)
        ids = self.reader.validate(question)  # empty text, window and length checks, as for a question
        candidates = self.reader.candidates(question)
        scores = self.policy.locate_scores(self.host, candidates, query.text)
        if scores is not None:
            blocks, values, method = candidates, scores.tolist(), "retrieval"
        else:
            _, _, chosen, _ = self.reader.prefill(question, ids, 1, mass := AttentionMass())
            per_block = block_masses(mass, self.reader.last_layer_blocks, chosen, self.host.sink.n_tokens)
            blocks, values, method = [chosen[bid] for bid in per_block], list(per_block.values()), "attention"
        shortlist = max(query.top_k, answer.locate_rerank)
        sources: dict[tuple[int, str], FrameBlock] = {}  # each moment's block (rank_moments fills it)
        moments = rank_moments(blocks, values, shortlist, sources)
        if answer.locate_rerank:  # each shortlisted moment's block read alone
            subject = subject_of(query.text)
            named_ids = self.store.words.named(subject) if answer.locate_words else {}  # the store's word index
            if named_ids and (named := words_shortlist([b for b in candidates if b.block_id in named_ids], subject, shortlist)):
                moments, method = with_named(moments, sources, named), method + "+words"  # blocks whose words name the thing
            moments = rerank_by_likelihood(moments, sources, lambda bs: read_alone(bs, query.text), query.top_k)
            method += "+likelihood"
        return LocateResult(moments, method, elapsed_s(t0, self.reader.adapter.device))
