"""Kept-token checks against references written here from the papers' definitions and transformers'
eager attention, never from the modules' own helpers (issue 15): TGV-KV's eviction after the
question's prefill. (HERMES' compression: tests/unit/test_presets.py; ReKV's retrieval:
test_engine_parity.py and test_presets.py.)"""

from __future__ import annotations

import math

import torch
from transformers.cache_utils import DynamicCache

from tests.unit.helpers import scene
from videokv_node.memory import GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.memory.config import TGVKVConfig


def _eager(a, embeds: torch.Tensor) -> tuple[list[torch.Tensor], DynamicCache]:
    """transformers' eager attention of one plain forward: per layer (H_q, N, N), and its cache."""
    lm = a.model.model.language_model
    saved = lm.config._attn_implementation
    lm.config._attn_implementation = "eager"
    cache = DynamicCache()
    try:
        with torch.no_grad():
            out = lm(inputs_embeds=embeds, position_ids=torch.arange(embeds.shape[1])[None], output_attentions=True,
                     past_key_values=cache, use_cache=True)
    finally:
        lm.config._attn_implementation = saved
    return [att[0] for att in out.attentions], cache


def _water_fill(mass: list[float], target: int, lo: list[int], hi: list[int]) -> list[int]:
    """TVB's b_l = B m_l / sum m within [lo, hi]: the scale t found by bisection, then integers by
    largest remainder (ties to the lower layer)."""
    def total(t):
        return sum(min(h, max(l_, t * m)) for m, l_, h in zip(mass, lo, hi))

    a, b = 0.0, 1.0
    while total(b) < target:
        b *= 2
    for _ in range(200):
        mid = (a + b) / 2
        a, b = (mid, b) if total(mid) < target else (a, mid)
    shares = [min(h, max(l_, b * m)) for m, l_, h in zip(mass, lo, hi)]
    base = [math.floor(s + 1e-12) for s in shares]
    order = sorted(range(len(mass)), key=lambda i: (-(shares[i] - base[i]), i))
    for i in order[: target - sum(base)]:
        base[i] += 1
    return base


def test_tgvkv_keeps_what_the_paper_definitions_give_on_eager_attention(tiny_adapter64):
    """`full` holds the whole stream, so the question's context is exactly one plain forward over
    [prompt, frames, question]: TVB budgets from its text-to-vision attention mass, TWR vision scores
    from the text tokens' weights, TPR (all text, then the top vision tokens) recomputed here, and the
    evicted cache compared with the plain cache at the kept indices."""
    a = tiny_adapter64
    T, S = a.tokens_per_frame, len(a.prefix_ids())
    frames = scene(8, seed=11)
    e = VideoMemoryEngine(a, MemoryConfig(policy="full", question_stage="tgvkv", budget_tokens=S + 20 * T, local_window_tokens=T,
                                          tgvkv=TGVKVConfig(keep_ratio=0.7)), GenerationConfig(max_new_tokens=2))
    for f in frames:
        e.ingest([f])
    seen = {}
    original = e.question_stage.evict

    def spy(cache):
        original(cache)
        seen["kept"] = [layer.keys[0].clone() for layer in cache.layers]  # (H, b_l, D)

    e.question_stage.evict = spy
    question = "where is the red box?"
    e.ask(Question(question, max_new_tokens=1))

    q_ids = a.question_ids(question, [])
    nq = len(q_ids)
    feats = a.encode_frames([f.rgb for f in frames])
    embeds = torch.cat([a.embed_tokens(a.prefix_ids()), feats.reshape(1, -1, feats.shape[-1]), a.embed_tokens(q_ids)], dim=1)
    attn, cache = _eager(a, embeds)
    K = embeds.shape[1]
    nv = K - S - nq
    text_cols = list(range(S)) + list(range(K - nq, K))
    vis_cols = list(range(S, K - nq))
    mass, plans = [], []
    for l, att in enumerate(attn):
        rows = att[:, K - nq :].double().mean(0)  # (nq, K): the question rows, heads averaged
        mass.append(float(rows[:, vis_cols].sum()))
        # TWR: w_j = mean attention text column j gets from the rows that see it; vision scored by the
        # attention of each question row weighted by its own token's normalised w.
        first_row = [0] * S + list(range(nq))
        w = [sum(float(rows[i, c]) for i in range(first_row[j], nq)) / (nq - first_row[j]) for j, c in enumerate(text_cols)]
        w = [x / sum(w) for x in w]
        s_vis = [sum(w[S + i] * float(rows[i, c]) for i in range(nq)) for c in vis_cols]
        plans.append(s_vis)
    lengths = [K] * len(attn)
    budgets = _water_fill(mass, math.ceil(0.7 * sum(lengths)), [1] * len(attn), lengths)
    assert e.question_stage.last_budgets == budgets
    for l, s_vis in enumerate(plans):
        n_text = S + nq
        assert budgets[l] > n_text  # this case keeps all text and part of the video
        top = sorted(range(nv), key=lambda j: (-s_vis[j], j))[: budgets[l] - n_text]
        keep = sorted(text_cols + [vis_cols[j] for j in top])
        torch.testing.assert_close(seen["kept"][l], cache.layers[l].keys[0][:, keep], rtol=0, atol=1e-6)
