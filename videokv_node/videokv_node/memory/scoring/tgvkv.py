"""TGV-KV scoring: text-grounded KV eviction for VLMs (arXiv 2606.03075).

TGV-KV evicts after a prefill that has a text query, and lets the text decide
everything (notes "Method"): how many tokens each layer keeps (TVB: in proportion to
the text-to-vision attention mass of the layer), which vision tokens matter (TWR:
vision columns of the text-to-vision attention, each text row weighted by how much the
later text attends to that text token), and which modality goes first when the budget
is tight (TPR: text is kept before any vision, because evicting text collapses the
model while vision is highly redundant).

In videokv this runs at question time: the rows of every attention block are the
question tokens (only they have queries then); the text columns are all text tokens in
the cache, the prompt before the video and the question itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from videokv_node.memory.scoring.top_k import top_k_stable

# A float share that should be an integer must not floor to the integer below.
_ROUND_EPS = 1e-9


def _work(x: torch.Tensor) -> torch.Tensor:
    """x in float64 if it is float64, else in float32."""
    return x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)


def tv_budgets(tv_mass: torch.Tensor, total: int, caps: Sequence[int], floor: Sequence[int]) -> list[int]:
    """Text-vision budgeting (TVB): split ``total`` over L layers in proportion to their TV attention mass.

    tv_mass: (L,) non-negative sum of the text-to-vision attention block of each layer.
    total:   tokens to hand out; caps[l]: most layer l can take (the tokens it holds);
             floor[l]: least it must get (tokens it must keep: 0, or its text count).
    Returns L ints b_l with sum exactly ``min(total, sum(caps))`` and
    floor[l] <= b_l <= caps[l]; raises ValueError if the floors do not fit.

    The paper's b_l = B * m_l / sum m is made to respect the bounds by water-filling:
    b_l = clamp(t * m_l, floor_l, cap_l) with the one scale t at which they sum to the
    target (layers at a cap give their excess to the others in proportion to mass;
    layers lifted to their floor take it from them). Found exactly by fixing, at each
    step, the side whose violation is larger (it is certain to stay clamped), at most
    L steps. If the free layers have no mass at all they share uniformly. Integers by
    largest remainder (ties to the lower layer), so every b_l is within 1 of its
    real-valued share.
    """
    n = tv_mass.shape[0]
    if len(caps) != n or len(floor) != n:
        raise ValueError(f"{n} layers but {len(caps)} caps and {len(floor)} floors")
    if total < 0 or any(f < 0 or f > c for f, c in zip(floor, caps)):
        raise ValueError(f"need total >= 0 and 0 <= floor <= cap per layer; total={total}, caps={caps}, floor={floor}")
    mass = tv_mass.to(torch.float64).tolist()
    if any(not math.isfinite(m) or m < 0 for m in mass):
        raise ValueError(f"tv_mass must be finite and non-negative, got {mass}")
    target = min(total, sum(caps))
    if sum(floor) > target:
        raise ValueError(f"floors sum to {sum(floor)}, more than the {target} tokens to hand out")
    shares = _water_fill(mass, target, floor, caps)
    return _largest_remainder(shares, target, floor, caps)


def _water_fill(mass: list[float], target: int, lo: Sequence[int], hi: Sequence[int]) -> list[float]:
    """Real shares clamp(t * mass_l, lo_l, hi_l) summing to ``target`` (sum lo <= target <= sum hi)."""
    share: dict[int, float] = {}
    while len(share) < len(mass):
        free = [layer for layer in range(len(mass)) if layer not in share]
        rest = target - sum(share.values())
        weight = {layer: mass[layer] for layer in free}
        if sum(weight.values()) <= 0.0:
            weight = dict.fromkeys(free, 1.0)
        total_weight = sum(weight.values())
        x = {layer: rest * weight[layer] / total_weight for layer in free}
        over = {layer: x[layer] - hi[layer] for layer in free if x[layer] > hi[layer]}
        under = {layer: lo[layer] - x[layer] for layer in free if x[layer] < lo[layer]}
        if not over and not under:
            share.update(x)
            break
        # The sum of the clamped shares at this scale is rest - sum(over) + sum(under): the
        # larger side tells which way the scale must move, and that side stays clamped.
        if sum(over.values()) >= sum(under.values()):
            share.update({layer: float(hi[layer]) for layer in over})
        if sum(under.values()) >= sum(over.values()):
            share.update({layer: float(lo[layer]) for layer in under})
    return [share[layer] for layer in range(len(mass))]


def _largest_remainder(shares: list[float], target: int, lo: Sequence[int], hi: Sequence[int]) -> list[int]:
    """Integers within 1 of ``shares``, in [lo, hi], summing to ``target``: floors, then +1 by largest fraction."""
    base = [min(hi[i], max(lo[i], math.floor(s + _ROUND_EPS))) for i, s in enumerate(shares)]
    by_fraction = sorted(range(len(shares)), key=lambda i: (-(shares[i] - base[i]), i))
    need = target - sum(base)
    while need > 0:  # terminates: target <= sum(hi), so some layer is below its cap
        for i in by_fraction:
            if need > 0 and base[i] < hi[i]:
                base[i] += 1
                need -= 1
    while need < 0:  # only after float rounding; terminates as sum(lo) <= target
        for i in reversed(by_fraction):
            if need < 0 and base[i] > lo[i]:
                base[i] -= 1
                need += 1
    return base


def text_weighted_scores(
    a_tt: torch.Tensor, a_tv: torch.Tensor, row_of_text_col: torch.Tensor, col_of_row: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Text-weighted ranking (TWR) of one layer: scores of the text and the vision tokens.

    a_tt:            (Nq, Nt) attention of the Nq query rows (question tokens) to the Nt
                     text tokens of the cache (prompt and question), heads averaged.
    a_tv:            (Nq, Nv) attention of the same rows to the Nv vision tokens.
    row_of_text_col: (Nt,) int64, first row that may attend to text column j: 0 for a
                     prompt token, the token's own row for a question token.
    col_of_row:      (Nq,) int64, the text column of the token of query row i.
    Returns (s_text (Nt,), s_vis (Nv,)).

    w_j = sum_{i >= row_of_text_col[j]} A_TT[i, j] / (Nq - row_of_text_col[j]) is the mean
    attention text token j receives from the rows that can see it, the paper's
    ``/ (N_t - j + 1)`` with rows and columns no longer the same tokens; it marks the
    "dominant" text tokens. w~ = w / sum_j w over text columns (uniform if all zero).
    Row i of A_TV is weighted by the w~ of its own token: s_vis_j = sum_i
    w~[col_of_row[i]] * A_TV[i, j]. (Prompt tokens have no row here, so the row weights do
    not sum to 1; renormalising them would scale s_vis by one constant and rank the
    same.) s_text_j = sum_{i >= row_of_text_col[j]} A_TT[i, j], the plain column sum for
    causal attention.
    """
    nq, nt = a_tt.shape
    if a_tv.shape[0] != nq or row_of_text_col.shape != (nt,) or col_of_row.shape != (nq,):
        raise ValueError(
            f"a_tt {tuple(a_tt.shape)}, a_tv {tuple(a_tv.shape)}, row_of_text_col "
            f"{tuple(row_of_text_col.shape)}, col_of_row {tuple(col_of_row.shape)} do not fit"
        )
    if nt and not bool(((row_of_text_col >= 0) & (row_of_text_col < nq)).all()):
        raise ValueError("row_of_text_col must lie in [0, Nq): every text token needs a row that sees it")
    if nq and not bool(((col_of_row >= 0) & (col_of_row < nt)).all()):
        raise ValueError("col_of_row must lie in [0, Nt)")
    rows = torch.arange(nq, device=a_tt.device)
    sees = rows[:, None] >= row_of_text_col[None, :].to(a_tt.device)  # (Nq, Nt)
    s_text = (_work(a_tt) * sees).sum(dim=0)  # (Nt,)
    w = s_text / (nq - row_of_text_col.to(s_text))  # (Nt,)
    w_sum = w.sum()
    w_norm = w / w_sum if float(w_sum) > 0.0 else torch.full_like(w, 1.0 / max(nt, 1))  # (Nt,)
    row_weight = w_norm[col_of_row]  # (Nq,)
    s_vis = row_weight @ _work(a_tv).to(row_weight.dtype)  # (Nv,)
    return s_text, s_vis


def text_prioritised_keep(
    budget: int, text_idx: torch.Tensor, vis_idx: torch.Tensor, s_text: torch.Tensor, s_vis: torch.Tensor
) -> torch.Tensor:
    """Text-prioritised retention (TPR) of one layer: ascending cache indices to keep, int64.

    text_idx (Nt,), vis_idx (Nv,): cache indices of the text and the vision tokens.
    s_text (Nt,), s_vis (Nv,): their TWR scores.
    budget > Nt: all text, plus the top ``budget - Nt`` vision tokens by s_vis (all of them
    if fewer); else the top ``budget`` text tokens by s_text and no vision. So text is
    never evicted while any vision token stays, and at most ``budget`` tokens are kept
    (fewer only when the layer holds fewer). Ties go to the lower position in its list.
    """
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}")
    if s_text.shape != text_idx.shape or s_vis.shape != vis_idx.shape:
        raise ValueError("scores must match their index tensors")
    # The scores come from the attention on the model's device, the indices may live on the
    # CPU: rank where the indices are, so neither index tensor is indexed from another device.
    s_text, s_vis = s_text.to(text_idx.device), s_vis.to(vis_idx.device)
    n_text = text_idx.numel()
    if budget > n_text:
        kept = torch.cat([text_idx, vis_idx[top_k_stable(s_vis, budget - n_text)]])
    else:
        kept = text_idx[top_k_stable(s_text, budget)]
    return torch.sort(kept.to(torch.int64)).values
