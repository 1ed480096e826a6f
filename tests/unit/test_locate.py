"""~/locate in the engine: rankings against scores computed by hand on the tiny model (float64).

retrieval (rekv): the reference reads the query's pre-RoPE queries with its own hooks on a
plain forward of [prompt, query], reduces them per KV group and scores every block's key
mean with explicit loops. attention (full): the reference runs one plain forward over
[prompt, frames, question], rotates the captured queries itself and takes the softmax
against the cached keys, summing each frame's share. likelihood re-ranking: the reference takes a
frame's K/V from a plain forward over the stream up to it, moves them right after the prompt by
re-rotating the keys, asks the prompt and feeds the query token by token.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers.cache_utils import DynamicCache

from tests.unit import references as ref
from tests.unit.helpers import plain_forward, random_frames, stream_positions
from videokv_node.memory import Frame, GenerationConfig, MemoryConfig, RequestError, VideoMemoryEngine
from videokv_node.config_base import ConfigError
from videokv_node.memory.config import AnswerConfig, ReKVConfig
from videokv_node.memory.questions.locate import LocateQuery, Moment, rank_moments, rerank_by_likelihood, subject_of
from videokv_node.pose import Pose, yaw_quaternion

ATOL = 1e-9
QUERY = "a red ball"


def make_engine(adapter, policy: str, rerank: int = 0, **kw) -> VideoMemoryEngine:
    """``rerank``: answer.locate_rerank (0 here, the first ranking alone, unless a test asks for it)."""
    cfg = dict(policy=policy, budget_tokens=100_000, local_window_tokens=50_000, offload_bytes=1 << 20, retrieve_frames=2)
    cfg.update(kw)
    return VideoMemoryEngine(adapter, MemoryConfig(**cfg), generation(rerank))


def generation(rerank: int, prompt: str = "What is in the image?") -> GenerationConfig:
    return GenerationConfig(max_new_tokens=2, answer=AnswerConfig(locate_rerank=rerank, locate_prompt=prompt))


def posed(frames: list[Frame]) -> list[Frame]:
    return [Frame(f.camera, f.stamp_ns, f.rgb, Pose.make("map", (i, -i, 0), yaw_quaternion(0.2 * i))) for i, f in enumerate(frames)]


def capture_queries(adapter, ids_before: list[int], ids: list[int], embeds_between=None):
    """Pre-RoPE queries (L, n, H_q, D) of ``ids``, forwarded after ``ids_before`` (and frame embeddings)."""
    geo = adapter.geometry
    got: dict[int, torch.Tensor] = {}
    handles = [m.register_forward_hook(lambda mod, inp, out, l=l: got.__setitem__(l, out[0].double()))
               for l, m in enumerate(adapter.query_modules())]
    try:
        parts = [adapter.embed_tokens(ids_before)]
        if embeds_between is not None:
            parts.append(embeds_between)
        parts.append(adapter.embed_tokens(ids))
        embeds = torch.cat(parts, dim=1)
        n_frames = 0 if embeds_between is None else embeds_between.shape[1] // adapter.tokens_per_frame
        positions = stream_positions(adapter, len(ids_before), n_frames, len(ids))
        cache = DynamicCache()
        adapter.forward(embeds, positions, cache, logits=False)
    finally:
        for h in handles:
            h.remove()
    n = len(ids)
    q = torch.stack([got[l][-n:].view(n, geo.n_q_heads, geo.head_dim) for l in range(geo.n_layers)])
    return q, cache, positions[:, -n:]


def count_forwards(monkeypatch, adapter) -> list[tuple[int, int, bool, int, int]]:
    """Record every decoder forward from now on: (input tokens, cache length before it, observed, logits
    read, rows), where observed means an attention observer was attached (locate's question prefill measures
    attention mass), logits read is how many positions' logits were asked for (re-ranking: the query's)
    and rows the batch (re-ranking reads frames of one size together)."""
    calls: list[tuple[int, int, bool, int, int]] = []
    real = adapter.forward

    def counted(embeds, positions, cache, logits=True, observer=None, n_logits=1):
        calls.append((embeds.shape[1], cache.get_seq_length(), observer is not None, n_logits, embeds.shape[0]))
        return real(embeds, positions, cache, logits=logits, observer=observer, n_logits=n_logits)

    monkeypatch.setattr(adapter, "forward", counted)
    return calls


def forward_kinds(calls, engine, adapter, text: str) -> list[str]:
    """Name each recorded forward: ``prefill`` (the question prefill, observed), ``probe`` (the text's
    tokens alone after the prompt sink: ``VideoMemoryEngine.probe``), ``rerank`` (the query's logits read:
    likelihood re-ranking) or ``encode`` (frames)."""
    probe_len = len(adapter.text_ids(text))
    return ["prefill" if observed else "rerank" if n_logits == probe_len > 1 else
            "probe" if (n, cached) == (probe_len, engine.sink.n_tokens) else "encode"
            for n, cached, observed, n_logits, _ in calls]


def test_rekv_locate_ranks_by_the_layer_mean_of_rekv_scores(tiny_adapter64, monkeypatch):
    a = tiny_adapter64
    geo = a.geometry
    frames = posed(random_frames(6, seed=3))
    e = make_engine(a, "rekv", rekv=ReKVConfig(selection="layer"))
    for f in frames:
        e.ingest([f])
    q, _, _ = capture_queries(a, a.prefix_ids(), a.text_ids(QUERY))  # (L, n, H_q, D)
    g = geo.n_q_heads // geo.n_kv_heads
    expected = {}
    for b in e.store.blocks():
        # the block's mean pre-RoPE keys recomputed from its stored keys by the reference's own RoPE
        km = torch.stack([ref.pre_rope_key_mean(a, b.layers[l].keys, b.positions[0]) for l in range(geo.n_layers)])  # (L, H, D)
        total = 0.0
        for l in range(geo.n_layers):
            per_head = 0.0
            for h in range(geo.n_kv_heads):
                qm = q[l, :, h * g:(h + 1) * g].mean(dim=(0, 1))  # mean over tokens and the group's heads
                per_head += float(qm @ km[l, h]) / math.sqrt(geo.head_dim)
            total += per_head / geo.n_kv_heads
        expected[b.stamp_ns] = total / geo.n_layers
    calls = count_forwards(monkeypatch, a)
    result = e.locate(LocateQuery(QUERY, top_k=4))
    assert forward_kinds(calls, e, a, QUERY) == ["probe"]  # the query's probe, nothing else
    assert result.method == "retrieval"
    order = sorted(expected, key=lambda s: (-expected[s], -s))[:4]
    assert [m.stamp_ns for m in result.moments] == order
    for m in result.moments:
        assert abs(m.score - expected[m.stamp_ns]) < ATOL
        assert m.pose == frames[[f.stamp_ns for f in frames].index(m.stamp_ns)].pose and m.camera == "cam"


def test_rekv_shared_locate_ranks_by_the_fused_layer_ranks(tiny_adapter64):
    """memory.rekv.selection: shared: a moment's score is the mean over layers of 1 / (1 + its rank in
    the layer), each layer ranking the blocks by the score above (equal scores: the newer first)."""
    a = tiny_adapter64
    geo = a.geometry
    e = make_engine(a, "rekv", rekv=ReKVConfig(selection="shared"))
    for f in random_frames(7, seed=4):
        e.ingest([f])
    q, _, _ = capture_queries(a, a.prefix_ids(), a.text_ids(QUERY))
    g = geo.n_q_heads // geo.n_kv_heads
    blocks = list(e.store.blocks())
    fused = {b.stamp_ns: 0.0 for b in blocks}
    km = {b.block_id: torch.stack([ref.pre_rope_key_mean(a, b.layers[l].keys, b.positions[0]) for l in range(geo.n_layers)])
          for b in blocks}  # (L, H, D) each, the reference's own RoPE
    for l in range(geo.n_layers):
        score = {}
        for b in blocks:
            score[b.stamp_ns] = sum(float(q[l, :, h * g:(h + 1) * g].mean(dim=(0, 1)) @ km[b.block_id][l, h])
                                    for h in range(geo.n_kv_heads))
        for rank, stamp in enumerate(sorted(score, key=lambda s: (-score[s], -s))):  # stamps grow with block ids
            fused[stamp] += 1.0 / (1 + rank) / geo.n_layers
    result = e.locate(LocateQuery(QUERY, top_k=3))
    assert result.method == "retrieval"
    assert [m.stamp_ns for m in result.moments] == sorted(fused, key=lambda s: (-fused[s], -s))[:3]
    for m in result.moments:
        assert abs(m.score - fused[m.stamp_ns]) < 1e-12


def test_full_locate_ranks_by_the_question_prefills_attention_mass(tiny_adapter64, monkeypatch):
    a = tiny_adapter64
    geo = a.geometry
    frames = random_frames(4, seed=5)
    e = make_engine(a, "full")
    for f in frames:
        e.ingest([f])
    feats = a.encode_frames([f.rgb for f in frames]).reshape(1, -1, a.model.config.text_config.hidden_size)
    ids = a.question_ids(QUERY, [])
    q, cache, qpos = capture_queries(a, a.prefix_ids(), ids, feats)  # the stream as one plain forward
    S, T, n = len(a.prefix_ids()), a.tokens_per_frame, len(ids)
    g = geo.n_q_heads // geo.n_kv_heads
    mass = torch.zeros(len(frames), dtype=torch.float64)
    for l in range(geo.n_layers):
        keys = cache.layers[l].keys[0].double()  # (H_kv, K, D) rotated
        K = keys.shape[1]
        qr = a.rotate_keys(q[l].transpose(0, 1), qpos)  # (H_q, n, D) rotated at the question's positions
        logits = torch.einsum("hnd,hkd->hnk", qr, keys.repeat_interleave(g, dim=0)) / math.sqrt(geo.head_dim)
        causal = torch.arange(K)[None, :] <= (K - n) + torch.arange(n)[:, None]
        probs = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)
        for f in range(len(frames)):
            mass[f] += probs[:, :, S + f * T:S + (f + 1) * T].sum(-1).mean()
    mass /= geo.n_layers
    calls = count_forwards(monkeypatch, a)
    result = e.locate(LocateQuery(QUERY, top_k=10))
    assert forward_kinds(calls, e, a, QUERY) == ["prefill"]  # one question prefill, no decoding
    assert result.method == "attention"
    assert len(result.moments) == len(frames)  # every frame is in full's context
    by_stamp = {f.stamp_ns: float(mass[i]) for i, f in enumerate(frames)}
    assert [m.stamp_ns for m in result.moments] == sorted(by_stamp, key=lambda s: (-by_stamp[s], -s))
    for m in result.moments:
        assert abs(m.score - by_stamp[m.stamp_ns]) < 1e-6  # the engine takes the softmax in float32 (attention_probs)
        assert m.pose is None


@pytest.mark.parametrize("policy, forwards", [
    ("streamkv", ["probe", "encode", "prefill"]),  # SelectKV's probe of the query; the open segment's frames
    # in the window, not yet blocks, encoded for the question (frames, not the query: as for ~/ask)
    ("hermes", ["prefill"]),  # its pseudo query was probed once at setup, not per request
    ("mukv", ["probe", "prefill"]),  # the question vector its pools are ranked by
    ("rekv", ["probe"]),  # retrieval scores from the probe alone, no prefill (selection shared here; layer:
    # test_rekv_locate_ranks_by_the_layer_mean_of_rekv_scores)
])
def test_every_policy_locates_within_the_window_with_one_prefill(tiny_adapter, monkeypatch, policy, forwards):
    """One question prefill at most, no decoding: the decoder forwards of one locate, counted and named."""
    a = tiny_adapter
    frames = posed(random_frames(8, seed=1))
    e = make_engine(a, policy)
    for f in frames:
        e.ingest([f])
    window = (frames[2].stamp_ns, frames[6].stamp_ns)
    pending = [u for u in e.policy.pending_units() if window[0] <= (u.stamps_ns or (u.stamp_ns,))[0] <= window[1]]
    calls = count_forwards(monkeypatch, a)
    result = e.locate(LocateQuery(QUERY, top_k=3, since_ns=window[0], until_ns=window[1]))
    kinds = forward_kinds(calls, e, a, QUERY)
    assert kinds == forwards, calls
    tokens = {k: [n for (n, _, _, _, _), kind in zip(calls, kinds) if kind == k] for k in ("prefill", "encode")}
    assert tokens["prefill"] == [len(a.question_ids(QUERY, []))] * kinds.count("prefill")  # the query, as an open question
    assert tokens["encode"] == ([len(pending) * a.tokens_per_frame] if "encode" in kinds else [])  # those frames only
    assert result.method == ("retrieval" if policy == "rekv" else "attention") and 1 <= len(result.moments) <= 3
    scores = [m.score for m in result.moments]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)  # rekv shared: in (0, 1]
    poses = {f.stamp_ns: f.pose for f in frames}
    for m in result.moments:
        assert window[0] <= m.stamp_ns <= window[1] and m.pose == poses[m.stamp_ns]


def test_locate_refuses_bad_requests_and_changes_nothing(tiny_adapter):
    e = make_engine(tiny_adapter, "rekv")
    with pytest.raises(RequestError, match="no frames"):
        e.locate(LocateQuery(QUERY, top_k=1))
    for f in random_frames(3):
        e.ingest([f])
    before = e.stats()
    for query, match in ((LocateQuery("  ", top_k=1), "empty"), (LocateQuery(QUERY, top_k=0), "top_k"),
                         (LocateQuery(QUERY, top_k=1, since_ns=5, until_ns=4), "after until"),
                         (LocateQuery(QUERY, top_k=1, cameras=["/other"]), "no frames")):
        with pytest.raises(RequestError, match=match):
            e.locate(query)
    assert e.stats() == before


def test_rank_moments_keeps_each_frames_best_score_and_skips_stampless_summaries():
    class B:  # the fields rank_moments reads
        def __init__(self, camera, stamps, kind="frame", poses=()):
            self.camera, self.stamps_ns, self.stamp_ns, self.kind, self.poses = camera, stamps, stamps[0], kind, poses

        def pose_at(self, s):
            return dict(zip(self.stamps_ns, self.poses)).get(s)

        def last_stamp(self, s):  # no still span (issue 36)
            return s

    p = Pose.make("odom", (1, 2, 3), (0, 0, 0, 1))
    blocks = [B("c", (1, 2, 3), kind="segment"), B("c", (2,), poses=(p,)), B("c", (0,), kind="summary"), B("d", (2,))]
    moments = rank_moments(blocks, [0.5, 0.1, 9.0, 0.5], top_k=10)
    assert [(m.stamp_ns, m.camera, m.score) for m in moments] == [(3, "c", 0.5), (2, "c", 0.5), (2, "d", 0.5), (1, "c", 0.5)]
    assert moments[1].pose == p  # the segment's best score, the frame block's pose
    assert len(rank_moments(blocks, [0.5, 0.1, 9.0, 0.5], top_k=2)) == 2


# --- likelihood re-ranking (answer.locate_rerank) ---------------------------------------------------

def frame_alone_logprob(a, frames: list[Frame], i: int, prompt: str, text: str) -> float:
    """The reference: frame ``i``'s K/V as the stream left them (one plain forward over [prompt, frames
    0..i]: every frame attends to all before it, as with make_engine's window), moved right after the
    prompt by re-rotating its keys, then ``prompt`` asked and ``text`` fed token by token, each token's
    log-probability read from the previous step's last logits; their mean."""
    S, T = len(a.prefix_ids()), a.tokens_per_frame
    _, stream = plain_forward(a, frames[:i + 1], [])
    old = stream_positions(a, S, i + 1, 0)[:, S + i * T:]
    new = stream_positions(a, S, 1, 0)[:, S:]
    delta = new - old
    layers = []
    for layer in stream.layers:
        k, v = layer.keys[0], layer.values[0]  # (H, S + (i+1) T, D)
        moved = a.rotate_keys(k[:, S + i * T:], delta if delta.shape[0] > 1 else delta[0])
        layers.append((torch.cat([k[:, :S], moved], dim=1)[None], torch.cat([v[:, :S], v[:, S + i * T:]], dim=1)[None]))
    cache = DynamicCache(ddp_cache_data=layers)
    ids, cont = a.question_ids(prompt, []), a.text_ids(text)
    pos = stream_positions(a, S, 1, len(ids))[:, S + T:]
    logits = a.forward(a.embed_tokens(ids), pos, cache)
    nxt = int(pos.max()) + 1
    lps = []
    for j, token in enumerate(cont):
        lps.append(float(torch.log_softmax(logits.double(), dim=0)[token]))
        if j + 1 < len(cont):
            logits = a.forward(a.embed_tokens([token]), a.text_positions(nxt, 1), cache)
            nxt += 1
    return sum(lps) / len(lps)


@pytest.mark.parametrize("batch", [8, 3])
@pytest.mark.parametrize("policy, first_forwards", [("rekv", ["probe"]), ("full", ["prefill"])])
def test_rerank_scores_each_shortlisted_frame_alone_by_the_querys_likelihood(tiny_adapter64, monkeypatch, policy,
                                                                             first_forwards, batch):
    """The first ranking's best N moments, each re-scored by the mean log-probability of the query's tokens
    as the answer to the prompt asked about that frame alone (hand-built cache, token-by-token reference),
    sorted by it; top_k of them returned. The 4 frames, of one size, are read ``REREAD_BATCH`` at a time,
    one forward per batch reading the query's logits (each row equals its frame read alone: the reference).
    ``full`` keeps its frames in a resident cache of its own: the re-ranking reads the blocks, not that."""
    from videokv_node.memory.context import model_runner as locate  # the re-reading runs there

    monkeypatch.setattr(locate, "REREAD_BATCH", batch)
    a = tiny_adapter64
    frames = posed(random_frames(6, seed=7))
    e = make_engine(a, policy, rekv=ReKVConfig(selection="layer"))
    for f in frames:
        e.ingest([f])
    first = e.locate(LocateQuery(QUERY, top_k=4))  # the first ranking (rerank 0), tested above
    stamps = [f.stamp_ns for f in frames]
    expected = {m.stamp_ns: frame_alone_logprob(a, frames, stamps.index(m.stamp_ns), "What is shown?", QUERY)
                for m in first.moments}
    e.reconfigure(e.config, generation(4, "What is shown?"))
    calls = count_forwards(monkeypatch, a)
    result = e.locate(LocateQuery(QUERY, top_k=3))
    assert result.method == ("retrieval" if policy == "rekv" else "attention") + "+likelihood"
    assert [m.stamp_ns for m in result.moments] == sorted(expected, key=lambda s: -expected[s])[:3]
    for m in result.moments:
        assert abs(m.score - expected[m.stamp_ns]) < ATOL and m.score < 0
        assert m.pose == frames[stamps.index(m.stamp_ns)].pose
    kinds = forward_kinds(calls, e, a, QUERY)
    assert kinds == first_forwards + ["rerank"] * math.ceil(4 / batch)
    assert [rows for *_, rows in calls[1:]] == ([4] if batch >= 4 else [3, 1])
    n_feed = len(a.question_ids("What is shown?", [])) + len(a.text_ids(QUERY)) - 1
    assert all((n, cached) == (n_feed, e.sink.n_tokens + a.tokens_per_frame) for n, cached, *_ in calls[1:])


@pytest.mark.parametrize("policy", ["streamkv", "hermes", "mukv", "full"])
def test_every_policy_reranks_its_shortlist_one_row_per_block(tiny_adapter, monkeypatch, policy):
    """Any first ranking (attention here) is re-ranked: one re-reading row per distinct block behind the
    shortlist (blocks of one size in one forward), each over the prompt sink and at most that block's tokens;
    the scores are log-probabilities."""
    a = tiny_adapter
    frames = posed(random_frames(8, seed=2))
    e = make_engine(a, policy, rerank=3)
    for f in frames:
        e.ingest([f])
    calls = count_forwards(monkeypatch, a)
    result = e.locate(LocateQuery(QUERY, top_k=2))
    kinds = forward_kinds(calls, e, a, QUERY)
    assert result.method == "attention+likelihood" and len(result.moments) == 2
    reranks = [c for c, k in zip(calls, kinds) if k == "rerank"]
    assert kinds[-len(reranks):] == ["rerank"] * len(reranks) and 1 <= sum(rows for *_, rows in reranks) <= 3
    limit = e.sink.n_tokens + max(b.n_tokens for b in e.store.blocks())
    assert all(e.sink.n_tokens < cached <= limit for _, cached, *_ in reranks)
    scores = [m.score for m in result.moments]
    assert scores == sorted(scores, reverse=True) and all(s <= 0 for s in scores)


def test_rerank_by_likelihood_scores_each_block_once_and_keeps_ties_in_order():
    seg = type("B", (), {"block_id": 7})()  # a block citing two frames (a segment)
    one = type("B", (), {"block_id": 3})()
    moments = [Moment(30, "cam", 0.9), Moment(10, "cam", 0.8), Moment(20, "cam", 0.7), Moment(40, "cam", 0.1)]
    sources = {(30, "cam"): seg, (10, "cam"): one, (20, "cam"): seg, (40, "cam"): one}
    asked = []

    def scores_of(blocks):
        asked.append([b.block_id for b in blocks])
        return [-1.0 if b.block_id == 7 else -2.0 for b in blocks]

    got = rerank_by_likelihood(moments, sources, scores_of, top_k=3)
    assert asked == [[7, 3]]  # each block once, in shortlist order
    assert [(m.stamp_ns, m.score) for m in got] == [(30, -1.0), (20, -1.0), (10, -2.0)]  # ties: the order given


def test_rerank_settings_are_checked():
    with pytest.raises(ConfigError, match="locate_rerank"):
        AnswerConfig(locate_rerank=-1)
    with pytest.raises(ConfigError, match="locate_prompt"):
        AnswerConfig(locate_prompt="  ")
    assert AnswerConfig().locate_rerank == 8  # on by default


@pytest.mark.parametrize("query, subject", [
    ("Where did you last see the red toolbox?", "the red toolbox"),
    ("where is the blue circle?", "the blue circle"),
    ("When did you first spot the number 7?", "the number 7"),
    ("Have you seen my keys recently?", "my keys"),
    ("Could you please find a person", "a person"),
    ("Show me the red key.", "the red key"),
    ("  the blue circle  ", "the blue circle"),  # a thing already: as given
    ("What colour is the shape?", "What colour is the shape?"),  # not a where/when/find request: as given
    ("Where is it?", "it"),
    ("where?", "where?"),  # nothing would be left: as given
    ("Findings of the day", "Findings of the day"),  # a word that starts like a request is not one
])
def test_subject_of_strips_the_request_around_the_thing(query, subject):
    assert subject_of(query) == subject


def test_rerank_scores_a_questions_subject(tiny_adapter, monkeypatch):
    """"Where did you last see a red ball?" is re-ranked exactly as "a red ball" (same scores, same order)."""
    frames = random_frames(5, seed=9)
    e = make_engine(tiny_adapter, "full", rerank=5)
    for f in frames:
        e.ingest([f])
    thing = e.locate(LocateQuery(QUERY, top_k=5))
    asked = e.locate(LocateQuery(f"Where did you last see {QUERY}?", top_k=5))
    assert {m.stamp_ns: m.score for m in asked.moments} == {m.stamp_ns: m.score for m in thing.moments}


@pytest.mark.parametrize("fixture", ["tiny_adapter", "tiny_qwen"])
def test_forward_n_logits_equals_feeding_the_tokens_one_by_one(request, fixture):
    """The adapters' ``n_logits``: the last n positions' logits of one pass, as n passes of one token each
    would give them (1-D RoPE and mRoPE)."""
    a = request.getfixturevalue(fixture)
    ids = a.question_ids("What is shown?", []) + a.text_ids(QUERY)
    sink = a.prefix_ids()
    start = len(sink)
    one = DynamicCache()
    a.forward(a.embed_tokens(sink), a.text_positions(0, start), one, logits=False)
    many = DynamicCache()
    a.forward(a.embed_tokens(sink), a.text_positions(0, start), many, logits=False)
    n = 4
    together = a.forward(a.embed_tokens(ids), a.text_positions(start, len(ids)), many, n_logits=n)
    head = ids[:-n + 1]
    rows = [a.forward(a.embed_tokens(head), a.text_positions(start, len(head)), one)]
    for i, token in enumerate(ids[len(head):]):
        rows.append(a.forward(a.embed_tokens([token]), a.text_positions(start + len(head) + i, 1), one))
    assert together.shape == (n, rows[0].shape[0])
    torch.testing.assert_close(together, torch.stack(rows[:n]), rtol=1e-4, atol=1e-4)
    assert a.forward(a.embed_tokens([ids[0]]), a.text_positions(start + len(ids), 1), many, n_logits=1).dim() == 1


def test_rerank_on_mrope_matches_the_frame_alone_reference(tiny_qwen):
    """Qwen2.5-VL (mRoPE: a frame is a (t, h, w) grid): the re-ranked scores equal the hand-built reference
    (float32 here, so to 1e-4), and a time window keeps the re-ranked moments inside it."""
    a = tiny_qwen
    frames = random_frames(5, seed=11)
    e = make_engine(a, "rekv", rerank=3, rekv=ReKVConfig(selection="layer"))
    for f in frames:
        e.ingest([f])
    stamps = [f.stamp_ns for f in frames]
    result = e.locate(LocateQuery(QUERY, top_k=3))
    assert result.method == "retrieval+likelihood" and len(result.moments) == 3
    for m in result.moments:
        ref = frame_alone_logprob(a, frames, stamps.index(m.stamp_ns), "What is in the image?", QUERY)
        assert abs(m.score - ref) < 1e-4, (m.stamp_ns, m.score, ref)
    window = e.locate(LocateQuery(QUERY, top_k=3, since_ns=stamps[1], until_ns=stamps[2]))
    assert {m.stamp_ns for m in window.moments} == {stamps[1], stamps[2]}
