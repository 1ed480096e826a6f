"""MuKV scoring: dual-signal compression and semi-hierarchical rerank (MuKV, IMBALDY/MuKV).

MuKV keeps the past video at three granularities, "patch" (a super-patch view of a
frame), "frame" and "segment" (several frames), each stored as independently encoded
blocks (notes §2-§3). Two pieces of math decide what survives:

- Dual-signal compression (notes §4-§6): inside each block, keep the top
  ``floor(rho_g * T)`` tokens by ``alpha_g * minmax(attention) + (1 - alpha_g) *
  minmax(frequency)``. Attention comes free from prefill but favours early tokens;
  the frequency signal of the keys marks visual change (motion, foreground detail).
- Semi-hierarchical rerank (notes §8-§9): at question time, over-retrieve blocks of
  every granularity by cosine to the question, then pull patch and frame candidates
  towards the centroid of the best segment candidates, so a local match from the
  wrong moment loses to one consistent with the retrieved events.

The defaults below are the paper's main setting, which the public RVS scripts also use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import MappingProxyType

import torch
import torch.nn.functional as F

from videokv_node.memory.scoring.top_k import top_k_stable

GRANULARITIES = ("patch", "frame", "segment")
# k_g: blocks retrieved per granularity at question time (notes §8; 64 in all).
RETRIEVE_K = MappingProxyType({"patch": 20, "frame": 32, "segment": 12})
# lambda_g: weight of segment consistency in the rerank (notes §9); segments keep their order.
RERANK_LAMBDA = MappingProxyType({"patch": 0.3, "frame": 0.3, "segment": 0.0})
# alpha_g: weight of attention against frequency in the dual signal (notes §6).
ATTENTION_WEIGHT = MappingProxyType({"patch": 0.5, "frame": 0.7, "segment": 0.8})
# rho_g: fraction of a block's tokens kept by compression (notes §6).
KEEP_RATIO = MappingProxyType({"patch": 0.1, "frame": 0.1, "segment": 0.8})
TOP_SEGMENTS = 5  # N: segment candidates averaged into the rerank centroid (notes §9, code default)
OVER_RETRIEVE = 2  # stage 1 retrieves over * k_g candidates (notes §8)
FREQUENCY_METHOD = "fft"  # the public scripts' FFT_METHOD; see ``frequency_importance``

# floor(rho * T) of a ratio that should land on an integer must not drop to the one below.
_ROUND_EPS = 1e-9


def _work(x: torch.Tensor) -> torch.Tensor:
    """x in float64 if it is float64, else in float32 (FFT and sums want at least float32)."""
    return x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)


def attention_importance(probs: torch.Tensor) -> torch.Tensor:
    """I_att(j) = 1/(H q) sum_h sum_i A[h, i, j] (notes §4): attention each token receives.

    probs: (H, q, K) last-layer attention probabilities of q query rows over K tokens
           (the caller slices the block's own tokens out of K).
    Returns (K,). The public code sums over queries of the head mean, which is q times
    this; the factor disappears in ``minmax``.
    """
    h, q, _ = probs.shape
    return _work(probs).sum(dim=(0, 1)) / (h * q)


def fft_energy(keys: torch.Tensor) -> torch.Tensor:
    """The paper's literal frequency score: I_fft(j) = 1/C sum_d |FFT_tokens(K)(j, d)| (notes §5).

    keys: (T, C) a block's keys (post-RoPE, as cached), tokens in order.
    Returns (T,): the mean magnitude of the j-th frequency bin, read as token j's score.

    This is how the formula turns a spectrum into a token-level score: bin j is assigned
    to token j. It therefore depends on a token's index, not its content: token 0
    always gets the DC bin (T times the mean key) and tokens j and T - j get equal
    scores (the spectrum of real keys is conjugate-symmetric). Kept for fidelity to the
    paper's equation; not the default (see ``high_frequency_energy``).
    """
    return torch.fft.fft(_work(keys), dim=0).abs().mean(dim=1)  # (T, C) complex -> (T,)


def high_frequency_energy(keys: torch.Tensor) -> torch.Tensor:
    """The public code's ``fft`` method: high-frequency energy mapped back to tokens (notes §5). Default.

    keys: (T, C) a block's keys, tokens in order. The code passes the last layer's keys
          averaged over heads, (T, D); the paper's concatenated heads, (T, H * D), fit too.
    Returns (T,): mean over channels of |high-pass(K)| at each token.

    Real FFT along the tokens, zero the DC and lower half of the bins (keep bins
    ``max(1, F // 2) .. F - 1`` of F = T // 2 + 1), inverse FFT back to the T tokens, and
    take each token's mean magnitude over channels. A token scores high where the keys
    change fast around it, which is what the notes mean by "high-frequency energy mapped
    back to token-level scores", unlike ``fft_energy``, whose score is indexed by bin.
    This is the variant of the public RVS scripts (FFT_METHOD="fft"); the Python
    loader's default, ``diff`` (adjacent key differences), is not implemented here.
    """
    t = keys.shape[0]
    spectrum = torch.fft.rfft(_work(keys), dim=0)  # (T // 2 + 1, C) complex
    spectrum[: max(1, spectrum.shape[0] // 2)] = 0
    high = torch.fft.irfft(spectrum, n=t, dim=0)  # (T, C) real
    return high.abs().mean(dim=1)  # (T,)


FREQUENCY_SCORES: Mapping[str, Callable[[torch.Tensor], torch.Tensor]] = MappingProxyType(
    {"fft": high_frequency_energy, "paper": fft_energy}
)


def frequency_importance(keys: torch.Tensor, method: str = FREQUENCY_METHOD) -> torch.Tensor:
    """I_fft of a block's keys (T, C) -> (T,) by ``method``: "fft" (default, the scripts') or "paper"."""
    if method not in FREQUENCY_SCORES:
        raise ValueError(f"method must be one of {sorted(FREQUENCY_SCORES)}, got {method!r}")
    return FREQUENCY_SCORES[method](keys)


def minmax(x: torch.Tensor) -> torch.Tensor:
    """Scale (T,) to [0, 1]: ``(x - min) / (max - min)``; a constant input gives zeros.

    Zeros, as the public code's ``+1e-8`` denominator gives: a constant signal ranks
    nothing, so in ``dual_signal`` it adds nothing and the other signal decides.
    """
    if x.numel() == 0:
        return _work(x)
    x = _work(x)
    lo, hi = x.min(), x.max()
    if float(hi - lo) <= 0.0:
        return torch.zeros_like(x)
    return (x - lo) / (hi - lo)


def dual_signal(att: torch.Tensor, fft: torch.Tensor, alpha: float) -> torch.Tensor:
    """I_g = alpha * minmax(att) + (1 - alpha) * minmax(fft) (notes §6); (T,), (T,) -> (T,) in [0, 1]."""
    if att.shape != fft.shape:
        raise ValueError(f"att {tuple(att.shape)} and fft {tuple(fft.shape)} differ")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return alpha * minmax(att) + (1.0 - alpha) * minmax(fft)


def keep_indices(scores: torch.Tensor, rho: float) -> torch.Tensor:
    """Ascending indices of the top ``kappa = max(1, floor(rho * T))`` tokens (notes §6); (T,) -> (kappa,) int64.

    Sorted ascending, as the public code sorts before slicing, so kept tokens keep their
    order inside the block. At least one token is kept (the code's ``int(T * rho)`` can
    be 0, which it then patches by keeping everything); ties go to the earlier token.
    """
    if not 0.0 < rho <= 1.0:
        raise ValueError(f"rho must be in (0, 1], got {rho}")
    t = scores.shape[0]
    if t == 0:
        return torch.zeros(0, dtype=torch.int64, device=scores.device)
    kappa = max(1, min(t, math.floor(rho * t + _ROUND_EPS)))
    return torch.sort(top_k_stable(scores, kappa)).values


def semi_hierarchical_rerank(
    scores: Mapping[str, torch.Tensor],
    reps: Mapping[str, torch.Tensor],
    k: Mapping[str, int] = RETRIEVE_K,
    lam: Mapping[str, float] = RERANK_LAMBDA,
    top_segments: int = TOP_SEGMENTS,
    over: int = OVER_RETRIEVE,
) -> dict[str, torch.Tensor]:
    """Two-stage retrieval of MuKV (notes §8-§9): parallel over-retrieval, then segment-guided rerank.

    scores: per granularity (N_g,) stage-1 scores of the stored blocks (cosine to the question).
    reps:   per granularity (N_g, C) block representative vectors (mean retained key).
    k, lam: per granularity budget k_g and rerank weight lambda_g (defaults: the paper's).
    Returns per granularity of ``scores`` the chosen block indices, ascending (time order),
    min(k_g, N_g) of them.

    Stage 1 takes the top ``over * k_g`` candidates of each granularity by score. The
    centroid c is the mean representative of the top ``top_segments`` segment
    candidates; each candidate j of every granularity is rescored
    ``(1 - lambda_g) * s_j + lambda_g * cos(r_j, c)`` and the top k_g are kept. With no
    segment candidates there is no centroid and no rerank (plain top-k_g by score); the
    public code would use the question vector as centroid instead, which this function
    does not see. Ties go to the lower index, so lambda = 0 is exactly plain top-k.
    """
    unknown = set(scores) - set(GRANULARITIES)
    if unknown:
        raise ValueError(f"unknown granularities {sorted(unknown)}; expected {GRANULARITIES}")
    if top_segments < 1 or over < 1:
        raise ValueError(f"top_segments and over must be >= 1, got {top_segments}, {over}")
    candidates = {}
    for g, s in scores.items():
        if reps[g].shape[0] != s.shape[0] or k[g] < 0 or not 0.0 <= lam[g] <= 1.0:
            raise ValueError(f"{g}: {s.shape[0]} scores, {reps[g].shape[0]} reps, k={k[g]}, lam={lam[g]}")
        candidates[g] = top_k_stable(s, over * k[g])  # (M_g,) best first
    centroid = None
    segments = candidates.get("segment")
    if segments is not None and segments.numel() > 0:
        centroid = _work(reps["segment"][segments[:top_segments]]).mean(dim=0)  # (C,)
    chosen = {}
    for g, cand in candidates.items():
        s = _work(scores[g][cand])  # (M_g,)
        if centroid is not None and lam[g] > 0.0:
            r = _work(reps[g][cand])  # (M_g, C)
            consistency = F.cosine_similarity(r, centroid[None, :].to(r.dtype), dim=1)  # (M_g,)
            s = (1.0 - lam[g]) * s + lam[g] * consistency
        chosen[g] = torch.sort(cand[top_k_stable(s, k[g])]).values
    return chosen
