"""MuKV scoring math: attention and frequency signals, dual-signal keep, semi-hierarchical rerank."""

from __future__ import annotations

import cmath
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from videokv_node.memory.scoring import mukv

FAST = settings(max_examples=40, deadline=None, derandomize=True)


def test_paper_defaults():
    assert dict(mukv.RETRIEVE_K) == {"patch": 20, "frame": 32, "segment": 12}
    assert dict(mukv.RERANK_LAMBDA) == {"patch": 0.3, "frame": 0.3, "segment": 0.0}
    assert dict(mukv.ATTENTION_WEIGHT) == {"patch": 0.5, "frame": 0.7, "segment": 0.8}
    assert dict(mukv.KEEP_RATIO) == {"patch": 0.1, "frame": 0.1, "segment": 0.8}
    assert (mukv.TOP_SEGMENTS, mukv.OVER_RETRIEVE, mukv.FREQUENCY_METHOD) == (5, 2, "fft")


# --- attention signal -------------------------------------------------------------------


def test_attention_importance_hand_computed():
    probs = torch.tensor(
        [
            [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0]],  # head 0, two query rows
            [[0.0, 1.0, 0.0], [0.2, 0.2, 0.6]],  # head 1
        ]
    )  # (H=2, q=2, K=3)
    # Column sums [1.7, 1.7, 0.6] over H * q = 4.
    torch.testing.assert_close(mukv.attention_importance(probs), torch.tensor([0.425, 0.425, 0.15]))


# --- frequency signals ------------------------------------------------------------------


def _dft(x: torch.Tensor) -> torch.Tensor:
    """Loop DFT along dim 0 of a (T, C) real tensor: Z[j, d] = sum_t x[t, d] e^{-2 pi i j t / T}."""
    t_len, c = x.shape
    z = torch.zeros(t_len, c, dtype=torch.complex128)
    for j in range(t_len):
        for d in range(c):
            z[j, d] = sum(float(x[t, d]) * cmath.exp(-2j * math.pi * j * t / t_len) for t in range(t_len))
    return z


def test_fft_energy_is_the_mean_bin_magnitude():
    # Constant keys have only a DC component: T * |c| averaged over channels.
    torch.testing.assert_close(mukv.fft_energy(torch.tensor([[1.0, -3.0]] * 4)), torch.tensor([8.0, 0.0, 0.0, 0.0]))
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(7, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(mukv.fft_energy(keys), _dft(keys).abs().mean(dim=1), rtol=0, atol=1e-10)


def test_high_frequency_energy_hand_computed():
    # T = 4: rfft bins 0..2, the lower half (bin 0) is dropped: the keys minus their mean.
    keys = torch.tensor([[1.0], [2.0], [3.0], [6.0]])
    torch.testing.assert_close(mukv.high_frequency_energy(keys), torch.tensor([2.0, 1.0, 0.0, 3.0]))
    # Constant keys have no high frequencies; an alternating sign is all Nyquist.
    torch.testing.assert_close(mukv.high_frequency_energy(torch.ones(8, 3)), torch.zeros(8))
    alt = torch.tensor([[1.0], [-1.0]] * 4)
    torch.testing.assert_close(mukv.high_frequency_energy(alt), torch.ones(8))


@pytest.mark.parametrize("t_len", [1, 2, 3, 5, 8, 9, 16])
def test_high_frequency_energy_matches_a_dft_high_pass(t_len):
    g = torch.Generator().manual_seed(t_len)
    keys = torch.randn(t_len, 3, generator=g, dtype=torch.float64)
    start = max(1, (t_len // 2 + 1) // 2)  # first kept rfft bin
    z = _dft(keys)
    keep = torch.tensor([min(j, t_len - j) >= start for j in range(t_len)])  # bin j and its mirror
    high = torch.fft.ifft(z * keep[:, None], dim=0).real  # (T, C)
    torch.testing.assert_close(mukv.high_frequency_energy(keys), high.abs().mean(dim=1), rtol=0, atol=1e-10)


def test_frequency_importance_dispatch():
    keys = torch.randn(6, 2, generator=torch.Generator().manual_seed(1))
    assert torch.equal(mukv.frequency_importance(keys), mukv.high_frequency_energy(keys))
    assert torch.equal(mukv.frequency_importance(keys, "paper"), mukv.fft_energy(keys))
    with pytest.raises(ValueError):
        mukv.frequency_importance(keys, "diff")


# --- dual signal and keep ---------------------------------------------------------------


def test_minmax():
    torch.testing.assert_close(mukv.minmax(torch.tensor([1.0, 3.0, 2.0])), torch.tensor([0.0, 1.0, 0.5]))
    assert torch.equal(mukv.minmax(torch.full((3,), 7.0)), torch.zeros(3))
    assert mukv.minmax(torch.zeros(0)).numel() == 0


def test_dual_signal_hand_computed():
    att = torch.tensor([0.0, 1.0, 2.0])  # -> [0, 0.5, 1]
    fft = torch.tensor([4.0, 0.0, 2.0])  # -> [1, 0, 0.5]
    torch.testing.assert_close(mukv.dual_signal(att, fft, 0.7), torch.tensor([0.3, 0.35, 0.85]))
    # A constant attention contributes nothing: frequency alone ranks.
    torch.testing.assert_close(mukv.dual_signal(torch.ones(3), fft, 0.7), torch.tensor([0.3, 0.0, 0.15]))
    with pytest.raises(ValueError):
        mukv.dual_signal(att, fft, 1.5)


def test_keep_indices_hand_computed():
    scores = torch.tensor([0.1, 0.9, 0.5, 0.9, 0.2])
    assert mukv.keep_indices(scores, 0.4).tolist() == [1, 3]
    assert mukv.keep_indices(scores, 0.1).tolist() == [1]  # floor(0.5) = 0 -> at least one; tie -> lower index
    assert mukv.keep_indices(scores, 1.0).tolist() == [0, 1, 2, 3, 4]
    assert mukv.keep_indices(torch.zeros(0), 0.5).tolist() == []
    with pytest.raises(ValueError):
        mukv.keep_indices(scores, 0.0)


@pytest.mark.parametrize(("t_len", "g", "kept"), [(49, "patch", 4), (196, "frame", 19), (784, "segment", 627)])
def test_keep_counts_of_the_paper_setting(t_len, g, kept):
    scores = torch.rand(t_len, generator=torch.Generator().manual_seed(t_len))
    assert mukv.keep_indices(scores, mukv.KEEP_RATIO[g]).numel() == kept


@FAST
@given(st.lists(st.integers(0, 5), min_size=1, max_size=60), st.integers(1, 100))
def test_keep_indices_count_order_and_top_k(values, pct):
    scores = torch.tensor(values, dtype=torch.float32)  # few distinct values: many ties
    kept = mukv.keep_indices(scores, pct / 100)
    t_len = len(values)
    assert kept.numel() == max(1, pct * t_len // 100)
    assert kept.dtype == torch.int64
    assert bool((kept[1:] > kept[:-1]).all())  # ascending, no repeats
    dropped = sorted(set(range(t_len)) - set(kept.tolist()))
    if dropped:
        assert float(scores[kept].min()) >= float(scores[dropped].max())


# --- semi-hierarchical rerank -----------------------------------------------------------


def test_rerank_hand_computed():
    scores = {
        "segment": torch.tensor([0.9, 0.1, 0.8]),
        "patch": torch.tensor([0.5, 0.45, 0.1]),
    }
    reps = {
        "segment": torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]]),
        "patch": torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0]]),
    }
    k = {"patch": 1, "frame": 1, "segment": 1}
    # Segment candidates [0, 2] -> centroid [1, 0]. Patch candidates [0, 1] with
    # consistency [0, 1]: reranked 0.7*0.5 + 0 = 0.35 < 0.7*0.45 + 0.3 = 0.615.
    # Patch 2 agrees with the centroid too but was not a stage-1 candidate.
    got = mukv.semi_hierarchical_rerank(scores, reps, k, {"patch": 0.3, "frame": 0.3, "segment": 0.0})
    assert {g: v.tolist() for g, v in got.items()} == {"segment": [0], "patch": [1]}
    plain = mukv.semi_hierarchical_rerank(scores, reps, k, {"patch": 0.0, "frame": 0.0, "segment": 0.0})
    assert plain["patch"].tolist() == [0]


def test_rerank_without_segments_is_plain_top_k():
    scores = {"patch": torch.tensor([0.2, 0.9, 0.4, 0.8]), "segment": torch.zeros(0)}
    reps = {"patch": torch.eye(4), "segment": torch.zeros(0, 4)}
    k = {"patch": 2, "segment": 3}
    got = mukv.semi_hierarchical_rerank(scores, reps, k, {"patch": 1.0, "segment": 0.0})
    assert got["patch"].tolist() == [1, 3]
    assert got["segment"].tolist() == []
    got = mukv.semi_hierarchical_rerank({"patch": scores["patch"]}, reps, k, {"patch": 1.0})
    assert got["patch"].tolist() == [1, 3]


def test_rerank_rejects_unknown_granularity():
    with pytest.raises(ValueError):
        mukv.semi_hierarchical_rerank({"clip": torch.zeros(2)}, {"clip": torch.zeros(2, 3)}, {"clip": 1}, {"clip": 0.0})


def _cos(a: list[float], b: list[float]) -> float:
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(x * x for x in b))
    return sum(x * y for x, y in zip(a, b)) / max(na * nb, 1e-8) if na and nb else 0.0


def _reference_rerank(scores, reps, k, lam, top_segments, over):
    """Plain-Python MuKV rerank: lists, explicit sorts with (score desc, index asc)."""

    def top(items, n):
        return sorted(items, key=lambda t: (-t[1], t[0]))[:n]

    cands = {g: [i for i, _ in top(list(enumerate(s)), over * k[g])] for g, s in scores.items()}
    seg = cands.get("segment", [])
    centroid = None
    if seg:
        chosen = seg[:top_segments]
        centroid = [sum(reps["segment"][i][c] for i in chosen) / len(chosen) for c in range(len(reps["segment"][0]))]
    out = {}
    for g, cand in cands.items():
        rescored = []
        for i in cand:
            s = scores[g][i]
            if centroid is not None and lam[g] > 0:
                s = (1 - lam[g]) * s + lam[g] * _cos(reps[g][i], centroid)
            rescored.append((i, s))
        # Stable order among candidates (they are already best-first by stage-1 score).
        ranked = sorted(range(len(rescored)), key=lambda p: -rescored[p][1])
        out[g] = sorted(rescored[p][0] for p in ranked[: k[g]])
    return out


@st.composite
def rerank_case(draw):
    c = draw(st.integers(1, 4))
    scores, reps, k, lam = {}, {}, {}, {}
    for g in mukv.GRANULARITIES:
        if g != "segment" and not draw(st.booleans()):
            continue
        n = draw(st.integers(0, 12))
        scores[g] = [draw(st.integers(-4, 4)) / 4 for _ in range(n)]  # coarse: ties happen
        reps[g] = [[draw(st.integers(-3, 3)) for _ in range(c)] for _ in range(n)]
        k[g] = draw(st.integers(0, 5))
        lam[g] = draw(st.sampled_from([0.0, 0.3, 0.5, 1.0]))
    return scores, reps, k, lam, draw(st.integers(1, 6)), draw(st.integers(1, 3)), c


def _tensors(scores, reps, c):
    t_scores = {g: torch.tensor(s, dtype=torch.float64) for g, s in scores.items()}
    t_reps = {g: torch.tensor(r, dtype=torch.float64).reshape(len(r), c) for g, r in reps.items()}
    return t_scores, t_reps


@FAST
@given(rerank_case())
def test_rerank_matches_a_python_reference(case):
    scores, reps, k, lam, top_segments, over, c = case
    t_scores, t_reps = _tensors(scores, reps, c)
    got = mukv.semi_hierarchical_rerank(t_scores, t_reps, k, lam, top_segments, over)
    ref = _reference_rerank(scores, reps, k, lam, top_segments, over)
    assert {g: v.tolist() for g, v in got.items()} == ref
    for g, v in got.items():
        assert v.numel() == min(k[g], len(scores[g]))


@FAST
@given(rerank_case())
def test_rerank_with_zero_lambda_is_plain_top_k(case):
    scores, reps, k, _, top_segments, over, c = case
    t_scores, t_reps = _tensors(scores, reps, c)
    got = mukv.semi_hierarchical_rerank(t_scores, t_reps, k, dict.fromkeys(scores, 0.0), top_segments, over)
    for g, s in scores.items():
        plain = sorted(sorted(range(len(s)), key=lambda i: (-s[i], i))[: k[g]])
        assert got[g].tolist() == plain
