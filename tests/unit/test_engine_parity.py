"""The engine against plain forwards: memory must not change what the model computes.

- ``full`` with a budget that holds the stream: incremental encoding and the
  answer equal one forward over [prompt, all frames, question].
- ``rekv`` with a window and a retrieval that cover everything: the same.
- ``rekv`` with a small window: each frame's KV equals an independent
  reference that keeps *un-rotated* keys and rotates them with transformers'
  own rotary code at placement (so our ``rotate_keys`` is checked against it).
- The per-layer retrieving cache gives the same logits as a static cache when
  it retrieves everything.
"""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicCache
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

from tests.unit import references as ref
from tests.unit.helpers import block_keys, block_values, greedy, plain_forward, random_frames
from videokv_node.memory import GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.memory.config import ReKVConfig
from videokv_node.memory.context.retrieval_cache import RetrievingCache, pack_layout, place_layer, placed_cache

ATOL = 1e-9


def make_engine(adapter, **kw) -> VideoMemoryEngine:
    cfg = dict(policy="full", budget_tokens=100_000, local_window_tokens=50_000, offload_bytes=1 << 20)
    cfg.update(kw)
    return VideoMemoryEngine(adapter, MemoryConfig(**cfg), GenerationConfig(max_new_tokens=6))


def ingest_one_by_one(engine, frames):
    for f in frames:
        engine.ingest([f])


@pytest.mark.parametrize("policy", ["full", "rekv"])
def test_unbounded_memory_equals_plain_forward(tiny_adapter64, policy):
    a = tiny_adapter64
    frames = random_frames(5)
    engine = make_engine(a, policy=policy, retrieve_frames=100)
    ingest_one_by_one(engine, frames)

    options = ["a red box", "a blue ball", "nothing"]
    ref_logits, ref_cache = plain_forward(a, frames, a.question_ids("what is there?", options))
    ref_probs = torch.softmax(ref_logits[a.option_token_ids(3)], 0)
    answer = engine.ask(Question("what is there?", options=options), option_scoring="letter")  # the letters' logits
    torch.testing.assert_close(torch.tensor(answer.option_scores, dtype=torch.float64), ref_probs, rtol=0, atol=ATOL)
    assert answer.option_index == int(torch.argmax(ref_probs))
    assert [e.stamp_ns for e in answer.evidence] == [f.stamp_ns for f in frames]

    # Every stored block is the slice of the plain forward's cache at its positions.
    sink = engine.sink.n_tokens
    for i, block in enumerate(engine.store.blocks()):
        span = slice(sink + i * a.tokens_per_frame, sink + (i + 1) * a.tokens_per_frame)
        assert block.positions[0].tolist() == list(range(span.start, span.stop))
        for layer, ref in enumerate(ref_cache.layers):
            torch.testing.assert_close(block.layers[layer].keys, ref.keys[0, :, span], rtol=0, atol=ATOL)
            torch.testing.assert_close(block.layers[layer].values, ref.values[0, :, span], rtol=0, atol=ATOL)

    q_ids = a.question_ids("describe", [])
    ref_logits, ref_cache = plain_forward(a, frames, q_ids)
    expected = greedy(a, ref_logits, ref_cache, ref_cache.get_seq_length(), 6)
    assert engine.ask(Question("describe", max_new_tokens=6)).text == expected


def reference_windowed_blocks(adapter, frames, window_frames: int):
    """ReKV's sliding-window encoding written independently of the engine.

    Keeps each frame's keys *un-rotated* and rotates them with transformers'
    ``rotary_emb`` + ``apply_rotary_pos_emb`` at the positions of each use.
    Returns per frame (keys_unrotated (L, H, T, D), values (L, H, T, D)).
    """
    lm = adapter.model.model.language_model
    T = adapter.tokens_per_frame

    def rotate(k, positions):  # k: (H, n, D) un-rotated -> rotated at positions
        cos, sin = lm.rotary_emb(k, positions[None])
        _, k_rot = apply_rotary_pos_emb(k[None], k[None], cos, sin)
        return k_rot[0]

    def unrotate(k, positions):
        return rotate(k, -positions)

    prefix = adapter.prefix_ids()
    sink_cache = DynamicCache()
    adapter.forward(adapter.embed_tokens(prefix), torch.arange(len(prefix)), sink_cache, logits=False)
    S = len(prefix)
    feats = adapter.encode_frames([f.rgb for f in frames])
    stored = []
    for i in range(len(frames)):
        window = stored[max(0, i - window_frames) : i]
        layers = []
        for layer in range(adapter.geometry.n_layers):
            ks, vs = [sink_cache.layers[layer].keys[0]], [sink_cache.layers[layer].values[0]]
            for j, (k_un, v) in enumerate(window):
                ks.append(rotate(k_un[layer], torch.arange(S + j * T, S + (j + 1) * T)))
                vs.append(v[layer])
            layers.append((torch.cat(ks, 1)[None], torch.cat(vs, 1)[None]))
        cache = DynamicCache(ddp_cache_data=layers)
        start = S + len(window) * T
        positions = torch.arange(start, start + T)
        adapter.forward(feats[i][None], positions, cache, logits=False)
        k = torch.stack([unrotate(l.keys[0, :, -T:], positions) for l in cache.layers])
        v = torch.stack([l.values[0, :, -T:] for l in cache.layers])
        stored.append((k, v))
    return stored


def test_sliding_window_encoding_matches_independent_reference(tiny_adapter64):
    a = tiny_adapter64
    frames = random_frames(7, seed=3)
    T = a.tokens_per_frame
    engine = make_engine(a, policy="rekv", local_window_tokens=2 * T, budget_tokens=100_000)
    ingest_one_by_one(engine, frames)
    reference = reference_windowed_blocks(a, frames, window_frames=2)
    for block, (k_un, v) in zip(engine.store.blocks(), reference):
        torch.testing.assert_close(a.rotate_keys(block_keys(block), -block.positions[0]), k_un, rtol=0, atol=1e-6)
        torch.testing.assert_close(block_values(block), v, rtol=0, atol=1e-6)
    # Positions stay bounded: no frame is ever placed past sink + window + one frame.
    assert max(int(b.positions.max()) for b in engine.store.blocks()) < engine.sink.n_tokens + 3 * T


def test_retrieving_cache_equals_static_cache_when_everything_is_retrieved(tiny_adapter64):
    a = tiny_adapter64
    engine = make_engine(a, policy="rekv", local_window_tokens=32, budget_tokens=100_000)
    ingest_one_by_one(engine, random_frames(4, seed=5))
    blocks = list(engine.store.blocks())
    q = a.question_ids("where?", [])
    per_layer = [blocks] * a.geometry.n_layers
    targets, n_ctx = pack_layout(a, engine.sink.n_tokens, per_layer)
    static = placed_cache(a, engine.store, engine.sink, per_layer, targets)
    logits_static = a.forward(a.embed_tokens(q), torch.arange(n_ctx, n_ctx + len(q)), static)
    calls = []

    def materialize(layer):
        calls.append(layer)
        return place_layer(a, engine.store, engine.sink, blocks, targets[layer], layer)

    lazy = RetrievingCache(n_ctx, materialize, a.geometry.n_layers)
    assert lazy.get_seq_length() == n_ctx  # the mask is sized before any layer runs
    logits_lazy = a.forward(a.embed_tokens(q), torch.arange(n_ctx, n_ctx + len(q)), lazy)
    assert calls == list(range(a.geometry.n_layers))
    torch.testing.assert_close(logits_lazy, logits_static, rtol=0, atol=ATOL)


def test_layer0_retrieval_picks_the_block_the_question_query_prefers(tiny_adapter64):
    """Layer 0's query depends only on the question tokens, so its top-k can be computed independently."""
    a = tiny_adapter64
    T = a.tokens_per_frame
    engine = make_engine(a, policy="rekv", local_window_tokens=T, retrieve_frames=2, budget_tokens=100_000,
                         rekv=ReKVConfig(selection="layer"))  # ReKV's in-pass retrieval, per layer
    ingest_one_by_one(engine, random_frames(8, seed=11))
    q_ids = a.question_ids("which frame had the most red?", [])
    engine.ask(Question("which frame had the most red?", max_new_tokens=1))

    lm = a.model.model.language_model
    attn = lm.layers[0].self_attn
    hidden = lm.layers[0].input_layernorm(a.embed_tokens(q_ids))
    geo = a.geometry
    q = attn.q_proj(hidden)[0].view(-1, geo.n_q_heads, geo.head_dim).mean(0)  # (H_q, D)
    q = q.view(geo.n_kv_heads, -1, geo.head_dim).mean(1)  # (H_kv, D)
    blocks = list(engine.store.blocks())
    pool = blocks[:-1]  # the newest frame is the fixed recent window
    scores = []
    for b in pool:
        k_mean = ref.pre_rope_key_mean(a, b.layers[0].keys, b.positions[0])  # (H, D) pre-RoPE, our own RoPE
        scores.append(float((q.double() * k_mean).sum().detach()))
    best = sorted(range(len(pool)), key=lambda i: -scores[i])[:2]
    expected = sorted([pool[i].block_id for i in best] + [blocks[-1].block_id])
    assert engine.last_layer_blocks[0] == expected
    assert all(len(ids) == 3 for ids in engine.last_layer_blocks)
