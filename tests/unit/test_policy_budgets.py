"""Budgets of every policy over long random streams, and each paper's selection arithmetic in the engine.

Invariants (hypothesis, every policy, both question stages): after every ingest
the resident KV (sink included) is at most ``budget_tokens`` tokens' worth,
offloaded bytes never exceed the cap, protected (summary) blocks are never
compressed, and a question always answers from blocks held.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.cache_utils import DynamicCache

from tests.unit import references as ref
from tests.unit.helpers import scene
from videokv_node.memory import ConfigError, GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.memory.store.block import Tier
from videokv_node.memory.config import HermesConfig, MuKVConfig, StreamKVConfig

POLICY_CONFIGS = {
    "full": {},
    "rekv": {},
    "streamkv": dict(streamkv=StreamKVConfig(similarity_threshold=0.9, min_segment_frames=2, max_segment_frames=5, retrieve_frames=3)),
    "hermes": dict(hermes=HermesConfig(chunk_frames=2)),
    "hermes-eager": dict(hermes=HermesConfig(reindex="eager", reindex_at=0.02, chunk_frames=1)),
    "mukv": dict(mukv=MuKVConfig(retrieve_patch=3, retrieve_frame=2, retrieve_segment=1)),
}




def engine(adapter, name: str, budget_frames: int, window_frames: int, offload_frames: int, stage: str = "none", **over):
    T = adapter.tokens_per_frame
    sink = len(adapter.prefix_ids())
    L = adapter.geometry.n_layers
    page_bytes = 4 * adapter.geometry.bytes_per_token // L
    cfg = dict(
        policy=name.split("-")[0],
        question_stage=stage,
        budget_tokens=sink + (window_frames + 1 + budget_frames) * T,
        local_window_tokens=window_frames * T,
        offload_bytes=offload_frames * L * (T // 4) * page_bytes,
        page_tokens=4,
        retrieve_frames=2,
    )
    cfg.update(POLICY_CONFIGS[name])
    cfg.update(over)
    return VideoMemoryEngine(adapter, MemoryConfig(**cfg), GenerationConfig(max_new_tokens=2, max_new_tokens_limit=4))


def check(e: VideoMemoryEngine, protected: dict[int, list[int]]) -> None:
    s = e.stats()
    L = e.adapter.geometry.n_layers
    resident_entries = e.store.resident_entries + e.sink.n_tokens * L
    assert resident_entries <= e.config.budget_tokens * L
    assert s.tokens_resident <= s.budget_tokens
    assert s.bytes_offloaded <= s.budget_offload_bytes <= e.config.offload_bytes
    # Exact bookkeeping: the store's counters are the sums over its blocks.
    assert e.store.resident_entries == sum(b.entries for b in e.store.blocks(Tier.RESIDENT))
    assert e.store.offloaded_entries == sum(b.entries for b in e.store.blocks(Tier.OFFLOADED))
    if e.store.arena is not None:
        pages = [p for b in e.store.blocks(Tier.OFFLOADED) for kv in b.layers if kv is not None for p in kv.pages]
        assert len(pages) == len(set(pages)) == e.store.arena.used_pages
    for b in e.store.blocks():
        assert not b.is_empty
        if b.protected:  # summary blocks: never compressed, in every layer they were made for
            assert [b.layer_tokens(l) for l in range(L)] == protected.setdefault(b.block_id, [b.layer_tokens(l) for l in range(L)])
            assert all(t in (0, b.n_tokens) for t in protected[b.block_id])
    if e.policy.name == "hermes":  # one resident cache with a per-layer budget
        for layer in range(L):
            held = sum(b.layer_tokens(layer) for b in e.store.blocks())
            assert held <= e.config.budget_tokens - e.sink.n_tokens


@settings(max_examples=12, deadline=None, derandomize=True)
@given(
    name=st.sampled_from(sorted(POLICY_CONFIGS)),
    stage=st.sampled_from(["none", "tgvkv"]),
    budget_frames=st.integers(1, 4),
    window_frames=st.integers(1, 2),
    offload_frames=st.integers(0, 5),
    n=st.integers(10, 45),
    seed=st.integers(0, 10**6),
)
def test_budgets_hold_over_long_random_streams(tiny_adapter, name, stage, budget_frames, window_frames, offload_frames, n, seed):
    e = engine(tiny_adapter, name, budget_frames, window_frames, offload_frames, stage)
    protected: dict[int, list[int]] = {}
    frames = scene(n, seed)
    for f in frames:
        e.ingest([f])
        check(e, protected)
    answer = e.ask(Question("what is there?", max_new_tokens=2))
    held = {s for b in e.store.blocks() for s in b.stamps_ns} | {s for u in e.policy.pending_units() for s in u.stamps_ns or (u.stamp_ns,)}
    assert {ev.stamp_ns for ev in answer.evidence} <= held
    check(e, protected)  # a question changes nothing


# --- StreamKV -----------------------------------------------------------------------
def test_streamkv_compression_keeps_exactly_n_blocks_per_segment_over_layers(tiny_adapter):
    """Eq. (9): N = ceil((1 - theta) T_i) x L frame blocks kept over all layers; summaries kept whole."""
    e = engine(tiny_adapter, "streamkv", 40, 2, 20,
               streamkv=StreamKVConfig(compression_ratio=0.6, min_segment_frames=3, max_segment_frames=8, retrieve_frames=2))
    L = tiny_adapter.geometry.n_layers
    for f in scene(24, seed=3, scene_len=5):
        e.ingest([f])
    blocks = sorted(e.store.blocks(), key=lambda b: b.order)
    segments, current = [], []
    for b in blocks:
        if b.kind == "summary":
            segments.append((current, b))
            current = []
        else:
            current.append(b)
    assert segments
    for frames_, summary in segments:
        n_frames = len(summary.stamps_ns) if all(len(b.stamps_ns) == 1 for b in frames_) else len(frames_)
        kept = sum(b.layer_tokens(l) // b.n_tokens for b in frames_ for l in range(L))
        assert kept == math.ceil(0.4 * n_frames) * L
        assert all(summary.layer_tokens(l) == summary.n_tokens for l in range(L))
    # Retrieval: N_r x L blocks over all layers, each layer at least one.
    e.ask(Question("where was the red box?", max_new_tokens=1))
    assert sum(e.policy.last_budgets) == 2 * L and min(e.policy.last_budgets) >= 1
    assert all(len(ids) >= 1 for ids in e.last_layer_blocks)


# --- MuKV ---------------------------------------------------------------------------
def test_mukv_builds_three_granularities_and_retrieves_in_time_order(tiny_adapter):
    T = tiny_adapter.tokens_per_frame
    e = engine(tiny_adapter, "mukv", 200, 2, 0, budget_tokens=100_000)
    for f in scene(8, seed=4):
        e.ingest([f])
    by_kind = {}
    for b in e.store.blocks():
        by_kind.setdefault(b.kind, []).append(b)
    assert len(by_kind["patch"]) == 8 * 4 and len(by_kind["frame"]) == 8 and len(by_kind["segment"]) == 2
    # Dual-signal compression keeps floor(rho |g|) tokens, the same ones in every layer, in order.
    for kind, rho, size in (("patch", 0.1, T // 4), ("frame", 0.1, T), ("segment", 0.8, 4 * T)):
        for b in by_kind[kind]:
            want = max(1, math.floor(rho * size + 1e-9))
            idx = [b.layers[l].index.tolist() for l in range(tiny_adapter.geometry.n_layers)]
            assert all(len(i) == want and i == sorted(i) and i == idx[0] for i in idx)
    e.ask(Question("what happened first?", max_new_tokens=1))
    sel = e.policy.last_selection
    assert (len(sel["patch"]), len(sel["frame"]), len(sel["segment"])) == (3, 2, 1)
    ids = e.last_layer_blocks[0]
    by_id = {b.block_id: b for b in e.store.blocks()}
    orders = [by_id[i].order for i in ids]
    assert orders == sorted(orders)  # time order, not granularity order (the public code's flaw)
    assert all(layer_ids == ids for layer_ids in e.last_layer_blocks)


# --- HERMES -------------------------------------------------------------------------
@pytest.mark.parametrize("reindex", ["lazy", "eager"])
def test_hermes_keeps_one_bounded_cache_with_summary_tokens(tiny_adapter, reindex):
    T = tiny_adapter.tokens_per_frame
    e = engine(tiny_adapter, "hermes", 3, 1, 0, hermes=HermesConfig(reindex=reindex, reindex_at=0.005, chunk_frames=1))
    budget = e.config.budget_tokens - e.sink.n_tokens
    for f in scene(30, seed=5):
        e.ingest([f])
    roles = e.policy.roles
    for layer, role in enumerate(roles):
        held = sum(b.layer_tokens(layer) for b in e.store.blocks())
        assert held == budget  # full, never over
        has_summary = e.policy.summary is not None and e.policy.summary.layers[layer] is not None
        assert has_summary == (role == "deep")
    assert e.store.offloaded_entries == 0 and e.store.arena is None
    if reindex == "lazy":
        assert e.policy.reindexed > 0
    # Logical positions after re-indexing stay below the model's limit however long the stream.
    assert max(int(kv.logical.max()) for b in e.store.blocks() for kv in b.layers if kv is not None) < 30 * T
    answer = e.ask(Question("what is there?", max_new_tokens=2))
    assert answer.n_context_tokens == e.config.budget_tokens


@pytest.mark.parametrize("name", sorted(POLICY_CONFIGS))
@pytest.mark.parametrize("stage", ["none", "tgvkv"])
def test_every_policy_runs_bounded_on_qwen25_vl(tiny_qwen, name, stage):
    """mRoPE: blocks are shifted as (t, h, w) grids; budgets and answers as on LLaVA-OV."""
    e = engine(tiny_qwen, name, 2, 1, 3, stage)
    protected: dict[int, list[int]] = {}
    for f in scene(14, seed=6):
        e.ingest([f])
        check(e, protected)
    answer = e.ask(Question("what is there?", max_new_tokens=2))
    assert answer.evidence
    for b in e.store.blocks():  # stored positions are 3-row mRoPE positions
        assert b.positions.shape[0] == 3


def test_hermes_compresses_once_per_chunk_and_never_over_budget(tiny_adapter):
    """Each compression leaves room for chunk_frames - 1 more frames: one compression per chunk."""
    T, chunk = tiny_adapter.tokens_per_frame, 3
    e = engine(tiny_adapter, "hermes", 6, 1, 0, hermes=HermesConfig(chunk_frames=chunk))
    budget = e.config.budget_tokens - e.sink.n_tokens  # per layer: 8 frames' worth
    held = []
    for f in scene(40, seed=8):
        e.ingest([f])
        held.append(max(sum(b.layer_tokens(l) for b in e.store.blocks()) for l in range(tiny_adapter.geometry.n_layers)))
    assert max(held) <= budget
    first = next(i for i, h in enumerate(held) if h < (i + 1) * T)  # the first compression
    assert e.policy.compressions == 1 + (40 - 1 - first) // chunk
    assert min(held[first:]) == budget - (chunk - 1) * T  # right after each compression


def test_hermes_refuses_a_budget_smaller_than_a_chunk(tiny_adapter):
    with pytest.raises(ConfigError, match="chunk_frames"):
        engine(tiny_adapter, "hermes", 2, 1, 0, hermes=HermesConfig(chunk_frames=16))


@pytest.mark.parametrize("name", ["streamkv", "mukv", "hermes"])
def test_time_window_cites_only_frames_inside_it(tiny_adapter, name):
    """Blocks holding several frames (summaries, merged frames, segments) are used only if all lie in the window."""
    e = engine(tiny_adapter, name, 40, 2, 20, streamkv=StreamKVConfig(min_segment_frames=3, max_segment_frames=4))
    for f in scene(24, seed=7, scene_len=6):
        e.ingest([f])
    since, until = 5 * 10**9, 14 * 10**9
    answer = e.ask(Question("what happened?", since_ns=since, until_ns=until, max_new_tokens=1))
    stamps = [ev.stamp_ns for ev in answer.evidence]
    assert stamps and all(since <= s <= until for s in stamps)


@pytest.mark.parametrize("split", ["softmax", "code"])
def test_streamkv_keeps_and_retrieves_exactly_what_selectkv_picks(tiny_adapter, split):
    """Compression against the guidance prompt and retrieval against the question are SelectKV over
    cosine scores of each block's representative key (Eqs. 9 and 11), recomputed here from the blocks
    with the references of tests/unit/references.py (the queries from a plain forward's q_proj); split
    code (paper preset): z-scores and the code's count rescaling, within (1 -/+ 0.75) x the mean kept
    count compressing, (1 -/+ 0.25) x N_r retrieving."""
    L, H_kv = tiny_adapter.geometry.n_layers, tiny_adapter.geometry.n_kv_heads
    e = engine(tiny_adapter, "streamkv", 60, 2, 40,
               streamkv=StreamKVConfig(compression_ratio=0.5, min_segment_frames=4, max_segment_frames=8, retrieve_frames=3, split=split))

    def pick(scores, total, low, high):
        return ref.selectkv(scores, total) if split == "softmax" else ref.selectkv_code(scores, total, low, high)

    # The representative keys (Eq. 3) recomputed here, not read from ``FrameBlock.key_mean``: each block's
    # keys as encoded, before SelectKV drops layers, rotated back to no position by the model's own
    # frequencies (references.rope_rotate, float64) and averaged over tokens, heads concatenated.
    inv_freq = tiny_adapter.model.model.language_model.rotary_emb.inv_freq
    rep_of: dict[int, torch.Tensor] = {}
    add = e.store.add

    def recording_add(block):
        rep_of[block.block_id] = torch.stack([ref.rope_rotate(kv.keys, -block.positions[0, kv.index], inv_freq).mean(1).reshape(-1)
                                              for kv in block.layers])  # (L, H_kv * D), float64
        return add(block)

    e.store.add = recording_add
    seen: dict[int, list] = {}
    for f in scene(30, seed=9, scene_len=6):
        for b in e.ingest([f]):
            seen[b.block_id] = b
    segments, current = [], []
    for b in sorted(seen.values(), key=lambda b: b.order):
        if b.kind == "summary":
            segments.append(current)
            current = []
        else:
            current.append(b)
    assert len(segments) >= 3
    probe = ref.probe_queries(tiny_adapter, e.policy.cfg.guidance_prompt)  # (L, n, H_q, D)
    guidance = [ref.mean_query(probe[l], H_kv) for l in range(L)]
    for frames_ in segments:
        reps = torch.stack([rep_of[b.block_id] for b in frames_])  # (T_i, L, H_kv * D)
        m = 0.5 * len(frames_)
        keep = pick([ref.cosine(reps[:, l], guidance[l]) for l in range(L)], math.ceil(m) * L, max(1, int(m * 0.25)), min(len(frames_), int(m * 1.75)))
        for l in range(L):
            assert [i for i, b in enumerate(frames_) if b.layers[l] is not None] == keep[l]

    question = "where is the red box?"
    e.ask(Question(question, max_new_tokens=1))
    probe = ref.probe_queries(tiny_adapter, question)
    query = [ref.mean_query(probe[l], H_kv) for l in range(L)]
    candidates = e.candidates(Question(question))
    pending = {b for ids in e.last_layer_blocks for b in ids} - {b.block_id for b in candidates}
    ranges = [[b for b in candidates if b.layers[l] is not None] for l in range(L)]
    picked = pick([ref.cosine(torch.stack([rep_of[b.block_id][l] for b in r]), query[l]) for l, r in enumerate(ranges)], 3 * L, 2.25, 3.75)
    for l in range(L):
        expected = sorted([ranges[l][i].block_id for i in picked[l]])
        assert sorted(i for i in e.last_layer_blocks[l] if i not in pending) == expected


def test_mukv_retrieves_exactly_the_semi_hierarchical_rerank(tiny_adapter):
    """Stage 1 (top 2k by cosine per granularity) and stage 2 (rerank against the top segments'
    centroid), recomputed from the blocks' representatives and the question's queries read from a
    plain forward's last-layer q_proj (tests/unit/references.py)."""
    geo = tiny_adapter.geometry
    # Strong rerank weights, so that stage 2 changes stage 1's order and the check has teeth.
    cfg = MuKVConfig(retrieve_patch=3, retrieve_frame=2, retrieve_segment=2, rerank_patch=0.9, rerank_frame=0.9)
    e = engine(tiny_adapter, "mukv", 200, 2, 0, budget_tokens=100_000, mukv=cfg)
    for f in scene(24, seed=10):
        e.ingest([f])
    question = "what happened first?"
    e.ask(Question(question, max_new_tokens=1))
    q = ref.mean_query(ref.probe_queries(tiny_adapter, question)[-1], geo.n_kv_heads)  # (H_kv * D,)
    by = {g: [b for b in e.store.blocks() if b.stream == g] for g in ("patch", "frame", "segment")}
    reps = {g: torch.stack([b.rep for b in bs]) for g, bs in by.items()}
    scores = {g: ref.cosine(reps[g], q) for g in by}
    picked = ref.mukv_rerank(
        scores, reps, {g: getattr(cfg, f"retrieve_{g}") for g in by}, {g: getattr(cfg, f"rerank_{g}") for g in by},
        top_segments=cfg.top_segments, over=cfg.over_retrieval,
    )
    assert any(picked[g] != sorted(sorted(range(len(scores[g])), key=lambda j: -scores[g][j])[: getattr(cfg, f"retrieve_{g}")])
               for g in ("patch", "frame"))  # the rerank changed something: the check has teeth
    for g, bs in by.items():
        assert sorted(e.policy.last_selection[g]) == sorted(bs[i].block_id for i in picked[g])
    # Every kept block's representative is the mean of its kept last-layer pre-RoPE keys.
    b = by["frame"][3]
    kv = b.layers[-1]
    inv_freq = tiny_adapter.model.model.language_model.rotary_emb.inv_freq
    pre = ref.rope_rotate(kv.keys, -b.positions[0, kv.index], inv_freq).float()  # (H, t, D)
    torch.testing.assert_close(b.rep, pre.transpose(0, 1).reshape(kv.n_tokens, -1).mean(0), rtol=0, atol=1e-5)


def test_tgvkv_keeps_text_first_within_budgets_proportional_to_text_vision_attention(tiny_adapter):
    """TVB budgets sum to ceil(ratio x entries), TPR keeps every text token while vision is kept, and
    the kept vision tokens are the top ones by text-weighted attention (checked on the evicted cache)."""
    from tests.unit.test_selection_references import _water_fill

    e = engine(tiny_adapter, "full", 200, 2, 0, budget_tokens=100_000, question_stage="tgvkv")
    e.config.tgvkv.keep_ratio = 0.7  # enough for all text in some layers and part of the video
    for f in scene(8, seed=11):
        e.ingest([f])
    stage = e.question_stage
    seen = {}
    original_evict, original_observer = stage.evict, stage.observer

    def observer(sink_len, n_q):
        observe = original_observer(sink_len, n_q)
        seen["sink"], seen["nq"] = sink_len, n_q
        return observe

    def evict(cache):
        seen["before"] = [int(l.keys.shape[-2]) for l in cache.layers]
        seen["rows"] = {l: r.clone() for l, r in stage._rows.items()}
        seen["keys"] = [l.keys.clone() for l in cache.layers]
        original_evict(cache)
        seen["after"] = [l.keys.clone() for l in cache.layers]

    stage.observer, stage.evict = observer, evict
    e.ask(Question("where is the red box?", max_new_tokens=2))
    s, nq, before = seen["sink"], seen["nq"], seen["before"]
    budgets = stage.last_budgets
    assert sum(budgets) == math.ceil(0.7 * sum(before))
    assert any(n > s + nq for n in budgets) and all(n < b for n, b in zip(budgets, before))
    tv = torch.tensor([float(seen["rows"][l][:, s : before[l] - nq].sum()) for l in range(len(before))])
    assert budgets == _water_fill(tv.tolist(), sum(budgets), [1] * len(before), before)  # the test's own TVB
    for l, n in enumerate(budgets):
        kept = seen["after"][l][0]  # (H, n, D)
        assert kept.shape[1] == n
        full = seen["keys"][l][0]
        text = torch.cat([full[:, :s], full[:, before[l] - nq :]], dim=1)
        if n > s + nq:  # every prompt and question key survives, in order, around the kept vision keys
            torch.testing.assert_close(kept[:, :s], text[:, :s], rtol=0, atol=0)
            torch.testing.assert_close(kept[:, n - nq :], text[:, s:], rtol=0, atol=0)


def test_hermes_deep_layer_keeps_the_tokens_the_pseudo_query_attends_to_most(tiny_adapter):
    """Without smoothing, a deep layer keeps exactly its top tokens by the attention the pseudo query
    pays them (softmax over sink + memory, queries placed at the next position), recomputed here."""
    geo = tiny_adapter.geometry
    cfg = HermesConfig(chunk_frames=1, summary_token=False, smoothing_shallow=0.0, smoothing_middle=0.0, smoothing_deep=0.0)
    e = engine(tiny_adapter, "hermes", 3, 1, 0, hermes=cfg)
    deep = e.policy.roles.index("deep")
    captured = {}
    original = e.policy._compress

    def spy(store, held):
        if "held" not in captured:
            captured["held"] = [(b, b.layers[deep]) for b in held if b.layers[deep] is not None]
            captured["next_pos"] = e.policy._next_pos
        original(store, held)

    e.policy._compress = spy
    for f in scene(12, seed=12):
        e.ingest([f])
        if "held" in captured:
            break
    held, next_pos = captured["held"], captured["next_pos"]
    # Keys where a question would see them (lazy: their logical positions), after the sink.
    inv_freq = tiny_adapter.model.model.language_model.rotary_emb.inv_freq
    keys = torch.cat([ref.rope_rotate(kv.keys, (kv.logical - b.positions[:, kv.index])[0], inv_freq) for b, kv in held], dim=1)
    keys = torch.cat([e.sink.keys[deep], keys], dim=1).float()  # (H_kv, S + N, D)
    # The probe's queries, read here from the model's own q_proj in one plain pass over [prompt, pseudo query].
    lm = tiny_adapter.model.model.language_model
    got = {}
    hook = lm.layers[deep].self_attn.q_proj.register_forward_hook(lambda m, i, o: got.__setitem__("q", o[0]))
    p_ids = tiny_adapter.prefix_ids() + tiny_adapter.text_ids(e.config.hermes.pseudo_query)
    try:
        with torch.no_grad():
            tiny_adapter.forward(tiny_adapter.embed_tokens(p_ids), tiny_adapter.text_positions(0, len(p_ids)), DynamicCache(), logits=False)
    finally:
        hook.remove()
    q = got["q"][len(tiny_adapter.prefix_ids()) :].view(-1, geo.n_q_heads, geo.head_dim)  # (n, H_q, D) pre-RoPE
    q = ref.rope_rotate(q.transpose(0, 1), torch.arange(next_pos, next_pos + q.shape[0]), inv_freq).float()  # (H_q, n, D)
    k = keys.repeat_interleave(geo.n_q_heads // geo.n_kv_heads, dim=0)
    attn = torch.softmax(q @ k.transpose(1, 2) / geo.head_dim**0.5, dim=-1).mean(dim=(0, 1))[e.sink.n_tokens :]
    ids = [(b.block_id, int(i)) for b, kv in held for i in kv.index]
    budget = e.config.budget_tokens - e.sink.n_tokens
    top = {ids[i] for i in torch.sort(attn, descending=True, stable=True).indices[:budget].tolist()}
    kept = {(b.block_id, int(i)) for b in e.store.blocks() if b.layers[deep] is not None for i in b.layers[deep].index}
    assert kept == top


def test_hermes_bookkeeping_stays_bounded_on_a_long_stream(tiny_adapter):
    e = engine(tiny_adapter, "hermes", 3, 1, 0, hermes=HermesConfig(chunk_frames=2))
    for f in scene(80, seed=13):
        e.ingest([f])
    assert set(e.policy._frame_of) <= {b.block_id for b in e.store.blocks()}
    assert len(e.policy._frame_of) <= len(e.store)
