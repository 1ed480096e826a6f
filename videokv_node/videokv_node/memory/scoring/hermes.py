"""HERMES scoring: the KV cache as a hierarchical memory (Zhang et al., arXiv 2601.14724).

HERMES evicts video tokens per decoder layer, with a different importance score for
each of three memory roles found by its attention analysis (notes §3.1, §3.3):
shallow layers attend almost only to the newest tokens (sensory memory: keep by
recency), deep layers peak on frame-level anchor tokens (long-term memory: keep by the
attention of a pseudo query), middle layers move from one to the other (working memory:
a depth-interpolated mix). Cross-layer smoothing (§3.4) lets a deeper layer's judgement
pull on the layer above it, so a token is not kept in one layer and dropped in the next
at random, and deep layers fold what they evict into one summary token.

The notes on the paper lost its formulas. Where one was lost, the choice made here is
stated in the function's docstring; the official inference script
(``inference/llavaov_online_official.py`` of haowei-freesky/HERMES) was read for the
layer thresholds, the smoothing weights and the summary token, and where this module
departs from it the docstring says so.

Shapes: N cached tokens of one layer, H heads, D head dim, L layers.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from types import MappingProxyType

import torch

ROLES = ("shallow", "middle", "deep")
SHALLOW_RATIO = 0.1  # notes §4.3: 10% shallow / 60% middle / 30% deep
DEEP_RATIO = 0.3
# Cross-layer smoothing weight lambda_l by the role of layer l: the official script's
# values (the paper's ablation values were lost from the notes).
SMOOTHING = MappingProxyType({"shallow": 0.1, "middle": 0.3, "deep": 0.4})

# Ratios times layer counts are compared with integers; this keeps 0.7 * 10 a 7.
_ROUND_EPS = 1e-9

RotateFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _work_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 stays float64; everything else is scored in float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def layer_roles(n_layers: int, shallow_ratio: float = SHALLOW_RATIO, deep_ratio: float = DEEP_RATIO) -> list[str]:
    """The memory role of each layer, shallow first: ``n_shallow`` + ``n_middle`` + ``n_deep`` = ``n_layers``.

    Rounding (the official script's thresholds): ``n_shallow = floor(L * shallow_ratio)``
    and ``n_deep = L - floor(L * (1 - deep_ratio))``, i.e. shallow rounds down and deep
    rounds up, so a 28-layer model gets 2/17/9 and a 24-layer one 2/14/8. There is
    always at least one deep layer (deep layers hold the summary token and are the
    last layer, the one smoothing never changes); shallow layers yield to deep ones.

    Tiny models: 1 layer -> ["deep"]; 2 layers -> ["middle", "deep"]; 3 -> ["middle",
    "middle", "deep"]. A 2-layer test model thus exercises both the attention/recency
    mix and the deep role; pure recency (shallow) needs no model to test.
    """
    if n_layers < 1:
        raise ValueError(f"n_layers must be >= 1, got {n_layers}")
    if not (0.0 <= shallow_ratio <= 1.0 and 0.0 <= deep_ratio <= 1.0 and shallow_ratio + deep_ratio <= 1.0):
        raise ValueError(f"need 0 <= ratios and shallow + deep <= 1, got {shallow_ratio}, {deep_ratio}")
    n_deep = max(1, n_layers - math.floor(n_layers * (1.0 - deep_ratio) + _ROUND_EPS))
    n_shallow = min(math.floor(n_layers * shallow_ratio + _ROUND_EPS), n_layers - n_deep)
    n_middle = n_layers - n_shallow - n_deep
    return ["shallow"] * n_shallow + ["middle"] * n_middle + ["deep"] * n_deep


def middle_bounds(roles: Sequence[str]) -> tuple[int, int] | None:
    """(first, last) index of the middle layers, the ``first_middle``/``last_middle`` of ``omega``; None if none."""
    middle = [i for i, r in enumerate(roles) if r == "middle"]
    return (middle[0], middle[-1]) if middle else None


def recency_scores(ages: torch.Tensor, decay: float) -> torch.Tensor:
    """Forgetting curve of shallow layers (notes §3.3 (1)): ``exp(-decay * age)``.

    ages: (N,) frames since each token's frame was encoded (0 = newest frame); int or float.
    Returns (N,) in (0, 1], non-increasing in age, 1 for age 0.

    The paper's formula was lost; its pseudocode has ``exp(-k * delta_t)``. The caller
    chooses the age (``memory.hermes.recency``): ``frame`` (robot, ours) frames since the
    token's frame with ``decay = k / oldest age``, so the tokens of one frame share a score;
    ``token`` (HERMES' official script, paper preset) token j of the layer's N cached video
    tokens aged ``N - 1 - j`` with ``decay = k / (N - 1)``, i.e. ``exp(-k (N-1-j) / (N-1))``,
    its place in the compacted cache, not its frame's age. k = 20 in the script.
    """
    if decay < 0:
        raise ValueError(f"decay must be >= 0, got {decay}")
    a = ages.to(torch.float64 if ages.dtype == torch.float64 else torch.float32)  # (N,)
    return torch.exp(-decay * a)


def omega(layer: int, first_middle: int, last_middle: int, omega0: float = 1.0, gamma: float = 1.0) -> float:
    """Weight of recency in a middle layer: ``omega0 - gamma * (l - l_short) / (l_long - l_short)``, in [0, 1].

    The linear schedule of the paper's pseudocode (notes §3.6 A) with l_short =
    ``first_middle`` and l_long = ``last_middle``. The paper's omega0/gamma were lost; our
    defaults 1/1 make the first middle layer pure recency (like the shallow layer above
    it) and the last middle layer pure attention (like the deep layer below it). The
    official script uses omega0 = 1, gamma = 0.9 with l_long = the first deep layer, so
    its last middle layer keeps a little recency. A single middle layer
    (``first_middle == last_middle``) sits halfway: ``omega0 - gamma / 2`` (0.5 by default).
    The result is clamped to [0, 1] so that any omega0/gamma give a convex mix.
    """
    if first_middle > last_middle:
        raise ValueError(f"first_middle {first_middle} > last_middle {last_middle}")
    if first_middle == last_middle:
        progress = 0.5
    else:
        progress = (layer - first_middle) / (last_middle - first_middle)
    return min(1.0, max(0.0, omega0 - gamma * progress))


def schedule_rate(layer: int, first_middle: int, last_middle: int, rate: float, rate_deep: float) -> float:
    """Forgetting rate of a middle layer: ``rate + (rate_deep - rate) * progress``, progress as in ``omega``.

    HERMES' script decays it from 20 at the shallow boundary towards 0.5 at the first deep
    layer (``k = 20 - 19.5 * progress``, progress reaching 1 at the first deep layer; pass
    that layer as ``last_middle``); ``rate_deep == rate`` keeps it fixed.
    """
    if first_middle > last_middle:
        raise ValueError(f"first_middle {first_middle} > last_middle {last_middle}")
    progress = 0.5 if first_middle == last_middle else (layer - first_middle) / (last_middle - first_middle)
    return rate + (rate_deep - rate) * min(1.0, max(0.0, progress))


def normalise(x: torch.Tensor) -> torch.Tensor:
    """Scores of one layer as a distribution: ``x / x.sum()``; all-zero -> uniform; (N,) -> (N,).

    Sum normalisation, not min-max (the official script uses min-max): smoothing and the
    middle-layer mix add scores of different layers and signals, and a distribution
    keeps a flat signal flat (it then expresses no preference), whereas min-max would
    stretch the smallest noise in a flat signal to the full [0, 1] range. An all-zero
    input (e.g. no attention measured) becomes uniform, the no-preference distribution.
    Input must be non-negative (attention probabilities, recency).
    """
    if x.numel() == 0:
        return x.clone()
    if bool((x < 0).any()):
        raise ValueError("normalise expects non-negative scores")
    total = x.sum()
    if float(total) <= 0.0:
        return torch.full_like(x, 1.0 / x.numel())
    return x / total


def layer_scores(role: str, attn: torch.Tensor | None, recency: torch.Tensor, omega: float) -> torch.Tensor:
    """Importance S_l of each token of one layer by its role (notes §3.3); (N,) -> (N,), sums to 1.

    shallow -> normalise(recency); deep -> normalise(attn); middle ->
    ``(1 - omega) * normalise(attn) + omega * normalise(recency)``. Every role is
    normalised (not only the middle mix) because cross-layer smoothing adds scores of
    adjacent layers, which must be on one scale; the order within a layer is unchanged.
    ``attn`` may be None where it gets no weight (shallow, or middle with omega == 1).
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    if not 0.0 <= omega <= 1.0:
        raise ValueError(f"omega must be in [0, 1], got {omega}")
    if attn is not None and attn.shape != recency.shape:
        raise ValueError(f"attn {tuple(attn.shape)} and recency {tuple(recency.shape)} differ")
    if role == "shallow" or (role == "middle" and omega == 1.0):
        return normalise(recency)
    if attn is None:
        raise ValueError(f"a {role} layer needs attention scores")
    if role == "deep":
        return normalise(attn)
    return (1.0 - omega) * normalise(attn) + omega * normalise(recency)


def smoothing_weights(roles: Sequence[str]) -> list[float]:
    """Default lambda_l per layer: ``SMOOTHING[role]`` (0.1/0.3/0.4), and 0 for the last layer (unused)."""
    return [SMOOTHING[r] for r in roles[:-1]] + [0.0] if roles else []


def cross_layer_smooth(
    scores: Sequence[torch.Tensor], ids: Sequence[torch.Tensor], lam: Sequence[float] | None = None
) -> list[torch.Tensor]:
    """Cross-layer memory smoothing (notes §3.4, pseudocode §3.6 B): layer l leans towards layer l + 1.

    scores: L tensors, scores[l] (N_l,) of the tokens layer l holds.
    ids:    L int64 tensors, ids[l] (N_l,) global token ids of those tokens, unique per
            layer; layers may hold different sets (eviction is per layer).
    lam:    L weights in [0, 1]; lam[l] for l < L - 1, the last entry is unused.
            Default: ``smoothing_weights(layer_roles(L))``.
    Returns L tensors (N_l,): ``(1 - lam_l) * s_l + lam_l * s_{l+1}[same id]``; the last
    layer unchanged.

    Guarantees: each smoothed score is a convex mix of the token's own score and its
    score in the next layer, and the last layer is returned as is. A token that layer
    l + 1 no longer holds contributes 0: that layer already judged it unimportant. The
    mix uses the raw s_{l+1} as the notes' pseudocode does; the official script chains
    (uses the already-smoothed l + 1) and, lacking ids, interpolates lengths instead:
    departure P10 in docs/POLICIES.md, kept under ``paper``.
    """
    n = len(scores)
    if len(ids) != n or any(s.shape != i.shape or s.dim() != 1 for s, i in zip(scores, ids)):
        raise ValueError("need one (N_l,) id tensor per (N_l,) score tensor")
    if n == 0:
        return []
    lam = smoothing_weights(layer_roles(n)) if lam is None else lam
    if len(lam) != n:
        raise ValueError(f"need {n} smoothing weights")
    out = []
    for layer in range(n - 1):
        if not 0.0 <= lam[layer] <= 1.0:
            raise ValueError(f"lam[{layer}] = {lam[layer]} not in [0, 1]")
        nxt = _align(scores[layer + 1], ids[layer + 1], ids[layer])  # (N_l,)
        out.append((1.0 - lam[layer]) * scores[layer] + lam[layer] * nxt)
    out.append(scores[-1])
    return out


def _align(values: torch.Tensor, from_ids: torch.Tensor, to_ids: torch.Tensor) -> torch.Tensor:
    """``values`` (M,) keyed by ``from_ids`` (M,), read at ``to_ids`` (N,); 0 where an id is absent."""
    if values.shape != from_ids.shape or torch.unique(from_ids).numel() != from_ids.numel():
        raise ValueError("ids must match their scores in shape and be unique per layer")
    out = torch.zeros(to_ids.shape, dtype=values.dtype, device=values.device)  # (N,)
    if from_ids.numel() == 0:
        return out
    sorted_ids, order = torch.sort(from_ids)  # (M,)
    pos = torch.searchsorted(sorted_ids, to_ids).clamp(max=from_ids.numel() - 1)  # (N,)
    found = sorted_ids[pos] == to_ids
    out[found] = values[order[pos[found]]]
    return out


def summary_token(
    keys: torch.Tensor,
    values: torch.Tensor,
    positions: torch.Tensor,
    target: int,
    rotate: RotateFn,
    prev: tuple[torch.Tensor, torch.Tensor, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Fold the tokens a deep layer evicts into one summary token (notes §3.4, pseudocode §3.6 C).

    keys, values: (H, N, D) the evicted tokens, keys post-RoPE at ``positions`` (N,) int64.
    target:       the position the summary token will have.
    rotate:       ``rotate(keys (..., T, D), delta (T,))`` re-rotates post-RoPE keys by
                  delta positions (e.g. ``models.rope.rotate_keys`` with the model's inv_freq).
    prev:         an earlier summary (k (H, D), v (H, D), count) whose key is already at
                  ``target`` (re-rotate it along with the cache if the summary moves).
    Returns (k (H, D), v (H, D), count) in the input dtypes, count = prev count + N.

    V is the plain mean. Each key is first rotated by ``target - position`` so that all
    sit at one phase, then averaged: RoPE is linear, so the mean of keys moved to
    ``target`` is exactly R(target) applied to the mean pre-RoPE key, the key a token
    with the mean content would have there; averaging keys of mixed phases would not be.
    With ``prev`` the result is the count-weighted running mean, so folding tokens in
    several steps equals folding them all at once. (The official script instead folds the
    old summary back in as one ordinary token.)
    """
    h, n, d = keys.shape
    if values.shape != keys.shape or positions.shape != (n,):
        raise ValueError(f"keys {tuple(keys.shape)}, values {tuple(values.shape)}, positions {tuple(positions.shape)}")
    if n == 0:
        if prev is None:
            raise ValueError("nothing to fold: no tokens and no previous summary")
        return prev
    work = _work_dtype(keys)
    delta = target - positions.to(torch.int64)  # (N,)
    k_sum = rotate(keys, delta).to(work).sum(dim=1)  # (H, D)
    v_sum = values.to(work).sum(dim=1)  # (H, D)
    count = n
    if prev is not None and prev[2] > 0:
        pk, pv, pc = prev
        if pk.shape != (h, d) or pv.shape != (h, d):
            raise ValueError(f"prev summary must be (H, D) = {(h, d)}")
        k_sum = k_sum + pk.to(work) * pc
        v_sum = v_sum + pv.to(work) * pc
        count += pc
    return (k_sum / count).to(keys.dtype), (v_sum / count).to(values.dtype), count


def pseudo_query_attention(query: torch.Tensor, keys: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of a pseudo query to the cached tokens, the W of deep/middle layers (notes §3.3 (2)).

    query: (Hq, n, D) post-RoPE queries of the n pseudo-question tokens (in streaming,
           a generic guidance prompt stands in for the unknown question).
    keys:  (Hkv, N, D) post-RoPE cached keys; GQA: query head h reads kv head
           h // (Hq // Hkv), as transformers' ``repeat_kv``.
    Returns (N,): softmax(q k^T * scale) over the N cached tokens, averaged over query
    tokens and heads; sums to 1 (for N > 0).

    The softmax runs over the cache only. In the model each pseudo-query token also
    attends to itself and the pseudo tokens before it; leaving them out rescales each
    row by a constant, which does not change which cached token a row prefers.
    """
    hq, _, d = query.shape
    hkv, n_cached, dk = keys.shape
    if d != dk or hq % hkv:
        raise ValueError(f"query {tuple(query.shape)} and keys {tuple(keys.shape)} do not fit (GQA: Hq % Hkv == 0)")
    work = _work_dtype(query)
    if n_cached == 0:
        return torch.zeros(0, dtype=work, device=query.device)
    k = keys.to(work).repeat_interleave(hq // hkv, dim=0)  # (Hq, N, D)
    logits = torch.einsum("hid,hjd->hij", query.to(work), k) * scale  # (Hq, n, N)
    return torch.softmax(logits, dim=-1).mean(dim=(0, 1))  # (N,)


def mixed_query(local: str, global_: str) -> str:
    """The middle layers' query of HERMES' script (``pseudo_forward`` in inference/llavaov_online_official.py):
    ``local_question + "; " + global_question``; the script's live scores of a layer are the softmax attention
    its pseudo-queries pay to the cached video tokens (``ModelRunner.pseudo_attention`` runs them)."""
    return f"{local}; {global_}"
