"""``memory.rekv.selection: shared`` (issue 15, ours): one retrieved set for every layer, the layers'
rankings fused by mean reciprocal rank. Checked against a hand-computed case, a brute-force
reference written here (hypothesis, ties included), and, through the engine, against the question's
queries read from a plain transformers forward with hooks on the attention's query projections."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit import references as ref
from tests.unit.helpers import random_frames
from tests.unit.test_policies import ADAPTER, GEO, block
from videokv_node.memory import ConfigError, GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.memory.policies.rekv import ReKVPolicy
from videokv_node.memory.context.selection import Static
from videokv_node.memory.store.block_index import Candidates
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.memory.config import AnswerConfig, ReKVConfig


def fused_reference(query: torch.Tensor, key_means: list[torch.Tensor], ids: list[int], k: int,
                    present: list[list[bool]] | None = None, ordered: bool = False) -> list[int]:
    """Per layer: score = sum over heads of q . k (the scale ranks nothing), rank by (score, id)
    descending, a block absent from the layer after every present one (newer first among those);
    fused = sum over layers of 1 / (1 + rank) in layer order; top-k by (fused, id) descending
    (``ordered``: in that order, else sorted by id)."""
    L = query.shape[0]
    fused = [0.0] * len(ids)
    for l in range(L):
        def key(i):
            here = present is None or present[i][l]
            return (here, float((query[l] * key_means[i][l]).sum()) if here else 0.0, ids[i])
        order = sorted(range(len(ids)), key=key, reverse=True)
        for rank, i in enumerate(order):
            fused[i] += 1.0 / (1 + rank)
    best = sorted(range(len(ids)), key=lambda i: (fused[i], ids[i]), reverse=True)[:k]
    return [ids[i] for i in best] if ordered else sorted(ids[i] for i in best)


def _store(key_means: list[torch.Tensor]) -> BlockStore:
    store = BlockStore(GEO, torch.device("cpu"), offload_bytes=0, page_tokens=4)
    for i, km in enumerate(key_means):
        b = block(i)
        b.key_mean = km
        store.add(b)
    return store


def _picked(store: BlockStore, query: torch.Tensor, k: int, mask=None) -> list[int]:
    index = store.index
    mask = index.candidate_mask() if mask is None else mask
    return sorted(index.blocks[s].block_id for s in index.fused_top_k(query, mask, k).tolist())


def test_fused_ranking_hand_computed():
    """Two layers, three blocks, scores along one axis: layer 0 ranks 2, 1, 0 (scores 3, 2, 1);
    layer 1 ranks 0, 1, 2 (scores 9, 1, 0). Fused: block 0: 1/3 + 1 = 1.333, block 1: 1/2 + 1/2 = 1,
    block 2: 1 + 1/3 = 1.333. Top-1: blocks 0 and 2 tie, the newer (2) wins; top-2: {0, 2};
    block 1 (second in both layers) is never picked before them. The mean score would have picked 0."""
    def km(s0, s1):
        t = torch.zeros(GEO.n_layers, GEO.n_kv_heads, GEO.head_dim)
        t[0, 0, 0], t[1, 0, 0] = s0, s1
        return t
    store = _store([km(1, 9), km(2, 1), km(3, 0)])
    query = torch.zeros(GEO.n_layers, GEO.n_kv_heads, GEO.head_dim)
    query[:, 0, 0] = 1.0
    assert _picked(store, query, 1) == [2]
    assert _picked(store, query, 2) == [0, 2]
    assert _picked(store, query, 3) == [0, 1, 2]
    assert _picked(store, query, 0) == []
    best_first = store.index.fused_top_k(query, store.index.candidate_mask(), 3).tolist()
    assert [store.index.blocks[s].block_id for s in best_first] == [2, 0, 1]  # 2 and 0 tie: the newer first


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 30), k=st.integers(0, 10), seed=st.integers(0, 10_000), evict=st.integers(0, 8),
       levels=st.integers(1, 4), masked=st.integers(0, 5), absent=st.integers(0, 4))
def test_fused_top_k_equals_a_brute_force_reference(n, k, seed, evict, levels, masked, absent):
    """Few score levels force ties inside a layer and in the fused score; evictions leave reused
    slots; masked blocks are never picked and do not move the others' ranks; a layer compressed
    away ranks its block last."""
    rng = random.Random(seed)
    store = BlockStore(GEO, torch.device("cpu"), offload_bytes=0, page_tokens=4)
    held = []
    for i in range(n):
        b = block(i)
        b.key_mean = torch.tensor([[[float(rng.randrange(levels))] + [0.0] * (GEO.head_dim - 1)] * GEO.n_kv_heads
                                   for _ in range(GEO.n_layers)])
        store.add(b)
        held.append(b)
    for b in rng.sample(held, min(evict, n - 1)):
        store.evict(b)
        held.remove(b)
    for b in rng.sample(held, min(absent, len(held))):
        store.keep(b, rng.randrange(GEO.n_layers), None)  # one layer compressed away
    out = set(b.block_id for b in rng.sample(held, min(masked, len(held) - 1)))
    mask = store.index.candidate_mask().clone()
    for bid in out:
        mask[store.index.slot_of[bid]] = False
    pool = [b for b in held if b.block_id not in out]
    query = torch.zeros(GEO.n_layers, GEO.n_kv_heads, GEO.head_dim)
    query[:, :, 0] = torch.tensor([1.0, -1.0])[:, None]  # the two layers rank in opposite directions
    expected = fused_reference(query, [b.key_mean for b in pool], [b.block_id for b in pool], k,
                               [[b.layers[l] is not None for l in range(GEO.n_layers)] for b in pool], ordered=True)
    assert _picked(store, query, k, mask) == sorted(expected)
    best_first = store.index.fused_top_k(query, mask, k).tolist()
    assert [store.index.blocks[s].block_id for s in best_first] == expected


def _question_queries(a, text: str) -> torch.Tensor:
    """(L, H_kv, D): the mean pre-RoPE query of ``text``'s tokens after the prompt prefix, read with
    forward hooks on every layer's q_proj during one plain forward of [prefix, text]."""
    lm = a.model.model.language_model
    geo = a.geometry
    prefix, own = a.prefix_ids(), a.text_ids(text)
    seen = {}
    hooks = [layer.self_attn.q_proj.register_forward_hook(lambda m, i, o, l=l: seen.__setitem__(l, o[0]))
             for l, layer in enumerate(lm.layers)]
    try:
        with torch.no_grad():
            lm(inputs_embeds=a.embed_tokens(prefix + own), position_ids=torch.arange(len(prefix) + len(own))[None])
    finally:
        for h in hooks:
            h.remove()
    out = []
    for l in range(geo.n_layers):
        q = seen[l][len(prefix):].float().view(len(own), geo.n_q_heads, geo.head_dim).mean(0)  # (H_q, D)
        out.append(q.view(geo.n_kv_heads, -1, geo.head_dim).mean(1))
    return torch.stack(out)


@pytest.mark.parametrize("window", [False, True])
def test_shared_selection_attends_the_same_fused_top_k_in_every_layer(tiny_adapter64, window):
    """Every layer attends exactly the recent window (when on) plus the fused top-k of the other
    blocks, the queries read from a plain forward of the question after the prompt, the key means
    recomputed from each block's stored keys rotated back to no position."""
    a = tiny_adapter64
    T = a.tokens_per_frame
    cfg = MemoryConfig(policy="rekv", local_window_tokens=2 * T, retrieve_frames=3, budget_tokens=100_000, page_tokens=1,
                       rekv=ReKVConfig(selection="shared", question_window=window))
    engine = VideoMemoryEngine(a, cfg, GenerationConfig())
    for f in random_frames(10, seed=5):
        engine.ingest([f])
    question = "which frame had the most red?"
    engine.ask(Question(question, max_new_tokens=1))

    blocks = list(engine.store.blocks())
    recent = [b.block_id for b in blocks[-2:]] if window else []
    pool = [b for b in blocks if b.block_id not in recent]
    key_means = [torch.stack([ref.pre_rope_key_mean(a, b.layers[l].keys, b.positions[0]).float()
                              for l in range(a.geometry.n_layers)]) for b in pool]
    expected = sorted(recent + fused_reference(_question_queries(a, question), key_means, [b.block_id for b in pool], 3))
    assert engine.last_layer_blocks == [expected] * a.geometry.n_layers
    engine.close()


def test_an_unknown_selection_is_refused():
    with pytest.raises(ConfigError, match="memory.rekv.selection"):
        ReKVConfig(selection="union")


# --- memory.rekv.rerank: the shortlist read alone by the question's likelihood -------------------------

@pytest.mark.parametrize("keep_share, kept", [(0.5, 1), (0.0, 0), (1.0, 2)])
def test_rerank_keeps_the_fused_best_and_fills_by_each_frames_likelihood(tiny_adapter64, monkeypatch, keep_share, kept):
    """rerank 2, retrieve_frames 2: the fused ranking's best 4 (plain-forward queries, reference above)
    are shortlisted; its first round(keep_share x 2) are attended, the rest of the 2 are the shortlist's
    others best by the question's mean log-probability as the answer to the prompt about each frame alone
    (test_locate's token-by-token reference on a hand-built cache); one re-reading row per such frame,
    all in one forward (one size), none when the fused ranking keeps all."""
    from tests.unit.test_locate import count_forwards, frame_alone_logprob

    a = tiny_adapter64
    frames = random_frames(8, seed=11)
    text, prompt = "a red ball", "What is shown?"
    cfg = MemoryConfig(policy="rekv", local_window_tokens=50_000, retrieve_frames=2, budget_tokens=100_000, page_tokens=1,
                       rekv=ReKVConfig(selection="shared", question_window=False, rerank=2, rerank_keep=keep_share))
    gen = GenerationConfig(max_new_tokens=1, answer=AnswerConfig(locate_prompt=prompt))
    engine = VideoMemoryEngine(a, cfg, gen)
    for f in frames:
        engine.ingest([f])
    blocks = list(engine.store.blocks())
    key_means = [torch.stack([ref.pre_rope_key_mean(a, b.layers[l].keys, b.positions[0]).float()
                              for l in range(a.geometry.n_layers)]) for b in blocks]
    shortlist = fused_reference(_question_queries(a, text), key_means, [b.block_id for b in blocks], 4, ordered=True)
    rest = shortlist[kept:]
    likelihood = {bid: frame_alone_logprob(a, frames, bid, prompt, text) for bid in rest} if kept < 2 else {}
    expected = shortlist[:kept] + sorted(rest, key=lambda bid: -likelihood[bid])[:2 - kept] if kept < 2 else shortlist[:2]
    calls = count_forwards(monkeypatch, a)
    engine.ask(Question(text, max_new_tokens=1))
    assert engine.last_layer_blocks == [sorted(expected)] * a.geometry.n_layers
    n_read = len(a.question_ids(prompt, [])) + len(a.text_ids(text)) - 1
    rereads = [c for c in calls if c[:2] == (n_read, engine.sink.n_tokens + a.tokens_per_frame)]
    assert [rows for *_, rows in rereads] == ([len(rest)] if kept < 2 else [])  # frames of one size: one forward
    engine.close()


@pytest.mark.parametrize("likelihood, expected", [({0: -3.0, 1: -1.0}, [1, 2]), ({0: -1.0, 1: -1.0}, [0, 2]),
                                                   ({0: -1.0, 1: -3.0}, [0, 2])])
def test_rerank_is_the_policys_through_read_alone(likelihood, expected):
    """The hand-computed ranking above (fused order 2, 0, 1) with retrieve_frames 2, rerank 2, rerank_keep 0.5:
    block 2 kept by the fused order, the other of the 2 the better of 0 and 1 by the host's reading of each
    alone (ties: the fused order, 0); read once, shortlist in fused order; one static set for every layer."""
    def km(s0, s1):
        t = torch.zeros(GEO.n_layers, GEO.n_kv_heads, GEO.head_dim)
        t[0, 0, 0], t[1, 0, 0] = s0, s1
        return t
    store = _store([km(1, 9), km(2, 1), km(3, 0)])
    query = torch.zeros(GEO.n_layers, 1, GEO.n_q_heads, GEO.head_dim)  # (L, n, H_q, D): one token
    query[:, 0, 0, 0] = 1.0
    reads = []

    def read_alone(blocks, text):
        reads.append(([b.block_id for b in blocks], text))
        return [likelihood[b.block_id] for b in blocks]

    host = SimpleNamespace(store=store, probe=lambda text: query, read_alone=read_alone)
    cfg = MemoryConfig(policy="rekv", budget_tokens=1000, local_window_tokens=4, retrieve_frames=2,
                       rekv=ReKVConfig(selection="shared", question_window=False, rerank=2, rerank_keep=0.5))
    selection = ReKVPolicy(cfg, ADAPTER).select(host, Candidates(store.index, store.index.candidate_mask()), "q")
    assert reads == [([0, 1], "q")]
    assert isinstance(selection, Static)
    assert [sorted(b.block_id for b in layer) for layer in selection.per_layer] == [expected] * GEO.n_layers


def test_rerank_is_off_in_the_paper_preset_and_checked():
    from videokv_node.memory.records.presets import preset_memory_config

    assert preset_memory_config("paper", "rekv").rekv.rerank == 0
    with pytest.raises(ConfigError, match="memory.rekv.rerank"):
        ReKVConfig(rerank=-1)
    with pytest.raises(ConfigError, match="rerank_keep"):
        ReKVConfig(rerank_keep=1.5)
