"""Selection references written from the papers' definitions, for tests only (issue 35, 5e).

Nothing here imports the production helpers it checks (``select_kv``, ``cosine_scores``,
``criterion``, ``semi_hierarchical_rerank``, ``engine.probe``): each is re-derived in float64
Python/torch from its equation, so a test comparing the engine with these is not comparing
the engine with itself.
"""

from __future__ import annotations

import math

import torch


def probe_queries(adapter, text: str) -> torch.Tensor:
    """(L, n, H_q, D) pre-RoPE queries of ``text`` right after the prompt sink, from one plain
    transformers forward of [prompt, text] with hooks on every layer's ``q_proj`` (StreamKV's guidance
    prompt / question and MuKV's question are read this way: the prompt only, no frames)."""
    lm = adapter.model.model.language_model
    geo = adapter.geometry
    ids = list(adapter.prefix_ids()) + list(adapter.text_ids(text))
    n = len(adapter.text_ids(text))
    seen: list[torch.Tensor] = []
    hooks = [layer.self_attn.q_proj.register_forward_hook(lambda _m, _i, out: seen.append(out[0, -n:].detach()))
             for layer in lm.layers]
    try:
        with torch.no_grad():
            embeds = lm.embed_tokens(torch.tensor([ids]))
            lm(inputs_embeds=embeds, position_ids=torch.arange(len(ids))[None], use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return torch.stack([q.view(n, geo.n_q_heads, geo.head_dim) for q in seen]).double()  # (L, n, H_q, D)


def rope_rotate(k: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """RoPE keys (..., T, D) moved by ``delta`` (T,) positions: the pairs (j, j + D/2) as complex numbers
    times exp(i delta f_j), the rotate-half convention of Llama/Qwen2, in float64 (not ``models/rope.py``)."""
    half = k.shape[-1] // 2
    z = torch.complex(k[..., :half].double(), k[..., half:].double())  # (..., T, D/2)
    turn = torch.polar(torch.ones(delta.numel(), half, dtype=torch.float64), delta.double().reshape(-1, 1) * inv_freq.double()[None, :])
    out = z * turn  # (..., T, D/2)
    return torch.cat([out.real, out.imag], dim=-1)  # (..., T, D)


def pre_rope_key_mean(adapter, keys: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """(H, D) mean over tokens of keys (H, T, D) stored rotated at 1-D ``positions`` (T,), rotated back to
    no position with ``rope_rotate`` and the model's own frequencies (its ``rotary_emb.inv_freq``), float64:
    ReKV's block key, not read from ``FrameBlock.key_mean`` nor rotated by the adapter's ``rotate_keys``."""
    inv_freq = adapter.model.model.language_model.rotary_emb.inv_freq
    return rope_rotate(keys, -positions.reshape(-1), inv_freq).mean(-2)


def mean_query(queries: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """One layer's (n, H_q, D) queries -> (H_kv * D,): mean over tokens, then over each GQA group."""
    n, h_q, d = queries.shape
    q = queries.double().mean(0)  # (H_q, D)
    return torch.stack([q[g * (h_q // n_kv_heads):(g + 1) * (h_q // n_kv_heads)].mean(0) for g in range(n_kv_heads)]).reshape(-1)


def cosine(reps: torch.Tensor, c: torch.Tensor) -> list[float]:
    """cos(r_j, c) for each row r_j of reps (N, C), in Python floats; 0 for a zero vector."""
    out = []
    c = [float(x) for x in c.double().reshape(-1)]
    nc = math.sqrt(sum(x * x for x in c))
    for r in reps.double():
        r = [float(x) for x in r.reshape(-1)]
        nr = math.sqrt(sum(x * x for x in r))
        out.append(sum(a * b for a, b in zip(r, c)) / (nr * nc) if nr and nc else 0.0)
    return out


def selectkv(scores: list[list[float]], total: int) -> list[list[int]]:
    """StreamKV's SelectKV (Eqs. 5-8): softmax per layer, C_l(k) the sums of its k largest, one global
    threshold p with K_l = min{k : C_l(k) >= p} summing to ``total`` (found by trying every distinct
    C value), then each layer's K_l best candidates (ties to the newer), ascending."""
    if total >= sum(len(s) for s in scores):
        return [list(range(len(s))) for s in scores]
    cums = []
    for s in scores:
        z = sum(math.exp(v) for v in s)
        acc, c = 0.0, []
        for v in sorted((math.exp(v) / z for v in s), reverse=True):
            acc += v
            c.append(acc)
        cums.append(c)
    for p in sorted({v for c in cums for v in c}):
        budgets = [next((k for k, v in enumerate(c, start=1) if v >= p), len(c)) if c else 0 for c in cums]
        if sum(budgets) == total:
            break
    else:
        raise AssertionError(f"no threshold p gives {total}: ties between layers' cumulative sums")
    return [sorted(sorted(range(len(s)), key=lambda j: (-s[j], -j))[:k]) for s, k in zip(scores, budgets)]


def mukv_rerank(scores: dict[str, list[float]], reps: dict[str, torch.Tensor], k: dict[str, int],
                lam: dict[str, float], top_segments: int, over: int) -> dict[str, list[int]]:
    """MuKV's semi-hierarchical retrieval (notes 8-9): per granularity the top ``over * k_g`` by score;
    c = the mean representative of the top ``top_segments`` segment candidates; each candidate rescored
    (1 - lambda_g) s + lambda_g cos(r, c); the top k_g kept (ties to the lower index), ascending."""
    def top(values: list[float], idx: list[int], m: int) -> list[int]:
        return sorted(idx, key=lambda j: (-values[j], j))[:m]

    cand = {g: top(s, list(range(len(s))), over * k[g]) for g, s in scores.items()}
    centroid = None
    if cand.get("segment"):
        centroid = reps["segment"][cand["segment"][:top_segments]].double().mean(0)  # (C,)
    out = {}
    for g, s in scores.items():
        rescored = dict(enumerate(s))
        if centroid is not None and lam[g] > 0:
            cons = cosine(reps[g][cand[g]], centroid)
            rescored = {j: (1 - lam[g]) * s[j] + lam[g] * c for j, c in zip(cand[g], cons)}
        out[g] = sorted(sorted(cand[g], key=lambda j: (-rescored[j], j))[: k[g]])
    return out


def zscores(s: list[float]) -> list[float]:
    """(x - mean) / std with the unbiased std, in Python floats; zeros for < 2 values or no spread."""
    n = len(s)
    if n < 2:
        return [0.0] * n
    m = sum(s) / n
    sd = math.sqrt(sum((x - m) ** 2 for x in s) / (n - 1))
    return [(x - m) / sd for x in s] if sd > 0 else [0.0] * n


def rescale_sum_match(arr: list[int], new_min: float, new_max: float) -> list[int]:
    """StreamKV's code's ``rescale_sum_match`` (model/abstract_streamkv.py), re-typed with numpy as it is
    written there; its argsort made stable so that ties go to the earlier layer."""
    import numpy as np

    a = np.array(arr, dtype=float)
    orig_sum, amin, amax = a.sum(), a.min(), a.max()
    if amin == amax:
        return a.astype(int).tolist()
    scaled = (a - amin) / (amax - amin) * (new_max - new_min) + new_min
    mapped = np.clip(np.round(scaled * (orig_sum / scaled.sum())), new_min, new_max)
    diff = int(round(orig_sum - mapped.sum()))
    if diff != 0:
        for i in (np.argsort(mapped, kind="stable") if diff > 0 else np.argsort(-mapped, kind="stable")):
            if (diff > 0 and mapped[i] < new_max) or (diff < 0 and mapped[i] > new_min):
                mapped[i] += 1 if diff > 0 else -1
                diff += -1 if diff > 0 else 1
                if diff == 0:
                    break
    return mapped.astype(np.int32).tolist()


def selectkv_code(scores: list[list[float]], total: int, low: float, high: float) -> list[list[int]]:
    """SelectKV as StreamKV's code splits it: z-scores before the softmax, the threshold split of
    ``selectkv``, the counts through ``rescale_sum_match`` into [low, high], at least 1, at most n_l."""
    z = [zscores(s) for s in scores]
    budgets = [len(k) for k in selectkv(z, total)]
    live = [i for i, s in enumerate(scores) if s]
    for i, k in zip(live, rescale_sum_match([budgets[i] for i in live], low, high) if live else []):
        budgets[i] = max(1, min(len(scores[i]), k))
    return [sorted(sorted(range(len(s)), key=lambda j: (-s[j], -j))[:k]) for s, k in zip(scores, budgets)]
