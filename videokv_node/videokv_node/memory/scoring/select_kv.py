"""StreamKV's unified layer-adaptive KV selection (SelectKV, Eq. 5-8 and Algorithm 1), pure torch.

One function serves both compression (criterion: the guidance prompt's mean
query) and retrieval (criterion: the question's mean query): each layer scores
its candidates by cosine similarity to its criterion, and a total budget ``N``
is split across layers by how concentrated each layer's scores are. A layer
whose softmax mass sits on few candidates reaches a cumulative threshold ``p``
early and gets few; a flat layer gets many.

Exact allocation instead of the binary search. ``K_l^p = min{k : C_l(k) >= p}``
(Eq. 7) is a step function of ``p``: for ``p`` in (0, 1],
``K_l^p = 1 + #{k : 1 <= k < n_l, C_l(k) < p}``, so
``sum_l K_l^p = L' + #{(l, k) : k < n_l, C_l(k) < p}`` with ``L'`` the number of
layers that have candidates. The ``p`` Algorithm 1 searches for therefore
selects the ``N - L'`` smallest cumulative sums over all layers, each adding one
to its layer. ``layer_budgets`` takes those directly: the same allocation
whenever the search succeeds, and an exact ``sum == N`` also when equal
cumulative sums straddle the cut, where no ``p`` exists and the search fails.
Algorithm 1 itself, literally, is the reference of ``tests/unit/test_select_kv.py`` (written there).

Cumulative sums are computed in float64 so that layers with identical scores
get bit-identical sums, which makes the documented tie rule observable.

Only the first cumulative sums can be taken (issue 16): ``C_l`` never decreases,
so the ``N - L'`` smallest over all layers lie among each layer's first ``N - L'``
(any later one has that many no larger and earlier in the tie order). A question
therefore softmaxes every candidate's score but sorts only the top ``N - L' + 1``
of each layer (``memory/scoring/top_k.py``: exact, the same values the full sort gives
first), and the kept candidates are a top-k, not a sort of all of them. The
answers are the full sort's, bit for bit (cumsum is a sequential scan, so a
prefix of the sums does not depend on what follows it).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from videokv_node.memory.scoring.queries import query_means
from videokv_node.memory.scoring.top_k import top_k_newest, top_k_stable, top_values


def criterion(queries: torch.Tensor, n_kv_heads: int) -> torch.Tensor:
    """(L, n, H_q, D) probe queries -> (L, H_kv * D): each layer's criterion c, the text's mean query per
    KV head (``scoring/queries.py``) with the heads concatenated (Eq. 3: "we do not distinguish between
    attention heads")."""
    return query_means(queries, n_kv_heads).reshape(queries.shape[0], -1)


def cosine_scores(reps: torch.Tensor, criterion: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Sim_l(j): cosine similarity of each candidate to the criterion, float32, (N,).

    reps: (N, D') representative keys; criterion: (D',). A zero vector on either
    side scores 0 (the denominator is clamped at ``eps``) instead of NaN, so a
    degenerate candidate is merely unattractive, never poisonous to the softmax.
    """
    if reps.dim() != 2 or criterion.dim() != 1 or reps.shape[1] != criterion.shape[0]:
        raise ValueError(
            f"cosine_scores needs reps (N, D') and criterion (D',), "
            f"got {tuple(reps.shape)} and {tuple(criterion.shape)}"
        )
    reps = reps.to(torch.float32)
    criterion = criterion.to(device=reps.device, dtype=torch.float32)
    dots = reps @ criterion  # (N,)
    norms = torch.linalg.vector_norm(reps, dim=1) * torch.linalg.vector_norm(criterion)  # (N,)
    return dots / norms.clamp_min(eps)


def cumulative_scores(scores: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """C_l(k) for k = 1..n_l: prefix sums of layer l's softmax (Eq. 6), sorted descending. float64, CPU.

    An empty layer gives an empty tensor. The sums do not depend on how equal
    scores are ordered, so they are well defined. (``_leading_cumulative`` with m the largest
    n_l: ``top_values`` of all of a layer is its full sort.)
    """
    return _leading_cumulative(scores, max((int(s.numel()) for s in scores), default=0))


def _leading_cumulative(scores: Sequence[torch.Tensor], m: int) -> list[torch.Tensor]:
    """``[c[:m] for c in cumulative_scores(scores)]`` without sorting all of each layer: the top m
    softmaxed values (exact partial sort) and their prefix sums. float64, CPU."""
    out = []
    for s in scores:
        s = s.detach().reshape(-1).to(device="cpu", dtype=torch.float64)  # (n_l,)
        if s.numel() == 0:
            out.append(s)
            continue
        out.append(torch.cumsum(top_values(torch.softmax(s, dim=0), m), dim=0))  # (min(m, n_l),), Eq. (6)
    return out


def layer_budgets(scores: Sequence[torch.Tensor], total: int) -> list[int]:
    """K_l per layer: the layer-adaptive split of ``total`` (Eq. 7 and Algorithm 1, solved exactly).

    scores[l]: (n_l,) raw similarities Sim_l(j) of layer l's candidates; n_l may be 0.

    Guarantees: ``sum(K) == min(total, sum n_l)``; ``0 <= K_l <= n_l``; ``K_l == 0``
    for an empty layer; ``K_l >= 1`` for every non-empty layer when ``total >= L'``;
    ``K`` never decreases, layer by layer, as ``total`` grows.

    Rule: every non-empty layer starts at 1, then the ``total - L'`` smallest
    cumulative sums ``C_l(k)``, ``k < n_l``, over all layers each add one to
    their layer (see the module docstring for why this is Algorithm 1's answer).

    Ties: equal cumulative sums are taken in order of layer index, then of k,
    so the earlier layer wins. Algorithm 1 has no answer in that case.

    Budget below one per layer (``total < L'``), which the paper excludes by
    assuming N >= L: our choice is to give 1 to the ``total`` layers whose top
    normalised score ``C_l(1)`` is largest (those where one candidate carries
    the most mass), ties by layer index. This continues the rule above: it is
    what ``p -> 0`` would keep if layers could get 0.
    """
    if total < 0:
        raise ValueError(f"layer_budgets: total must be >= 0, got {total}")
    counts = [int(s.numel()) for s in scores]
    if total >= sum(counts):
        return counts
    nonempty = [layer for layer, n in enumerate(counts) if n > 0]
    budgets = [0] * len(counts)
    # Only C_l(k) for k <= N - L' can be taken (module docstring), and C_l(1) for the case below.
    cums = _leading_cumulative(scores, max(1, total - len(nonempty)))
    if total <= len(nonempty):
        tops = torch.stack([cums[layer][0] for layer in nonempty]) if nonempty else torch.zeros(0)  # (L',)
        for i in top_k_stable(tops, total).tolist():  # equal tops: the lower layer
            budgets[nonempty[i]] = 1
        return budgets
    for layer in nonempty:
        budgets[layer] = 1
    # Candidates k < n_l of every layer (the first N - L' of them), concatenated in (layer, k) order
    heads = [c[: counts[layer] - 1] for layer, c in enumerate(cums)]
    values = torch.cat(heads)
    owners = torch.cat([torch.full((h.numel(),), layer, dtype=torch.int64) for layer, h in enumerate(heads)])
    # A stable ascending sort takes equal sums in (layer, k) order: the documented tie rule.
    taken = owners[torch.sort(values, stable=True).indices[: total - len(nonempty)]]
    extra = torch.bincount(taken, minlength=len(counts)).tolist()
    return [b + e for b, e in zip(budgets, extra)]


# StreamKV's code (soulpower/StreamKV, eval.sh): the temperatures of its count rescaling.
CODE_COMPRESS_TEMP, CODE_RETRIEVE_TEMP = 0.75, 0.25


def code_bounds(mean: float, temp: float, most: float, integer: bool) -> tuple[float, float]:
    """[low, high] of StreamKV's code's count rescaling: (1 -/+ temp) x the mean count, at least 1 and at most
    ``most``; compression truncates them to ints (``int(...)``), retrieval keeps floats, as the code does."""
    low, high = mean * (1 - temp), mean * (1 + temp)
    if integer:
        low, high = int(low), int(high)
    return max(low, 1), min(high, most)


def standardise(s: torch.Tensor) -> torch.Tensor:
    """(n,) -> (n,) float64 z-scores (unbiased std, as ``torch.std``), StreamKV's code before its softmax.
    Fewer than 2 candidates or no spread give zeros (the code would give NaN): no preference."""
    s = s.detach().reshape(-1).to(device="cpu", dtype=torch.float64)
    if s.numel() < 2 or float(s.std()) == 0.0:
        return torch.zeros_like(s)
    return (s - s.mean()) / s.std()


def rescale_counts(counts: Sequence[int], low: float, high: float) -> list[int]:
    """StreamKV's code's ``rescale_sum_match``: counts mapped linearly onto [low, high] (min to low, max to
    high), scaled back to their sum, rounded half to even, clipped to [low, high]; then the rounding
    difference handed out one at a time in a single pass, to the smallest counts first when short, the
    largest first when over (ties: the earlier layer; the code's argsort leaves them unspecified). A single
    pass, as the code: the sum may stay off when the range is too narrow. Equal counts are returned as is."""
    total, lo, hi = sum(counts), min(counts), max(counts)
    if lo == hi:
        return list(counts)
    scaled = [(c - lo) / (hi - lo) * (high - low) + low for c in counts]
    ratio = total / sum(scaled)
    mapped = [min(high, max(low, round(x * ratio))) for x in scaled]
    diff = int(round(total - sum(mapped)))
    for i in sorted(range(len(mapped)), key=lambda i: mapped[i] if diff > 0 else -mapped[i]):
        if diff == 0:
            break
        if (diff > 0 and mapped[i] < high) or (diff < 0 and mapped[i] > low):
            mapped[i] += 1 if diff > 0 else -1
            diff += -1 if diff > 0 else 1
    return [int(m) for m in mapped]


def code_layer_budgets(scores: Sequence[torch.Tensor], total: int, low: float, high: float) -> list[int]:
    """K_l as StreamKV's code splits ``total`` (``obtain_cdf_num`` then ``rescale_sum_match``): each layer's
    scores standardised before Eq. (6)'s softmax, the threshold of Eq. (7) solved exactly (the code's
    bisection stops within 5 of ``total``), the counts rescaled into [low, high], at least 1 and at most
    what each layer holds (0 for an empty one). The sum is ``total`` only where the rescaling allows."""
    counts = [int(s.numel()) for s in scores]
    nonempty = [layer for layer, n in enumerate(counts) if n > 0]
    budgets = layer_budgets([standardise(s) for s in scores], total)
    if not nonempty:
        return budgets
    rescaled = rescale_counts([budgets[layer] for layer in nonempty], low, high)
    for layer, k in zip(nonempty, rescaled):
        budgets[layer] = max(1, min(counts[layer], k))
    return budgets


def select_kv(scores: Sequence[torch.Tensor], total: int, bounds: tuple[float, float] | None = None) -> list[torch.Tensor]:
    """SelectKV (Eq. 8) on precomputed similarities: per layer, the indices of its K_l best candidates.

    scores[l]: (n_l,). Returns, per layer, an int64 (K_l,) tensor of candidate
    indices in ascending order (= time order, so callers can concatenate the
    kept blocks as they were encoded), with ``K_l`` from ``layer_budgets``.
    Equal scores at the cut go to the later index, i.e. the newer candidate,
    for determinism (the same rule as ``scoring/rekv.py`` ``top_k_blocks``).
    ``bounds`` (low, high): split as StreamKV's code does (``code_layer_budgets``) instead.
    """
    out = []
    budgets = layer_budgets(scores, total) if bounds is None else code_layer_budgets(scores, total, *bounds)
    for s, k in zip(scores, budgets):
        s = s.detach().reshape(-1)  # (n_l,)
        # The k best, newest first among equals at the cut (a stable sort of the reversed scores, exactly).
        out.append(top_k_newest(s, k).to(device="cpu", dtype=torch.int64))
    return out
