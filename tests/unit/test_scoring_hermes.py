"""HERMES scoring math: layer roles, recency, omega schedule, smoothing, summary token, pseudo-query attention."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.references import rope_rotate as rotate_keys  # a RoPE reference written in the tests
from videokv_node.memory.scoring import hermes

FAST = settings(max_examples=40, deadline=None, derandomize=True)


# --- layer roles -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n_layers", "roles"),
    [
        (1, ["deep"]),
        (2, ["middle", "deep"]),
        (3, ["middle", "middle", "deep"]),
        (10, ["shallow"] + ["middle"] * 6 + ["deep"] * 3),
    ],
)
def test_layer_roles_of_small_models(n_layers, roles):
    assert hermes.layer_roles(n_layers) == roles


@pytest.mark.parametrize("n_layers", [24, 28, 32, 80])
def test_layer_roles_match_the_official_thresholds(n_layers):
    # llavaov_online_official.py: shallow below int(L * 0.1), deep from int(L * 0.7).
    roles = hermes.layer_roles(n_layers)
    short, long = int(n_layers * 0.1), int(n_layers * 0.7)
    assert roles == ["shallow"] * short + ["middle"] * (long - short) + ["deep"] * (n_layers - long)


@FAST
@given(st.integers(1, 200), st.integers(0, 50), st.integers(0, 50))
def test_layer_roles_are_ordered_and_complete(n_layers, shallow_pct, deep_pct):
    roles = hermes.layer_roles(n_layers, shallow_pct / 100, deep_pct / 100)
    assert len(roles) == n_layers
    rank = [hermes.ROLES.index(r) for r in roles]
    assert rank == sorted(rank)
    assert roles[-1] == "deep"
    assert roles.count("shallow") <= math.floor(n_layers * shallow_pct / 100 + 1e-9)


def test_layer_roles_reject_bad_arguments():
    with pytest.raises(ValueError):
        hermes.layer_roles(0)
    with pytest.raises(ValueError):
        hermes.layer_roles(10, 0.8, 0.3)


def test_middle_bounds():
    assert hermes.middle_bounds(hermes.layer_roles(10)) == (1, 6)
    assert hermes.middle_bounds(hermes.layer_roles(2)) == (0, 0)
    assert hermes.middle_bounds(["deep"]) is None


# --- recency and omega -----------------------------------------------------------------


def test_recency_is_the_forgetting_curve():
    got = hermes.recency_scores(torch.tensor([0, 1, 2, 4]), 0.5)
    torch.testing.assert_close(got, torch.tensor([1.0, math.exp(-0.5), math.exp(-1.0), math.exp(-2.0)]))
    with pytest.raises(ValueError):
        hermes.recency_scores(torch.tensor([0]), -1.0)


@FAST
@given(st.lists(st.integers(0, 500), min_size=1, max_size=30), st.floats(0.0, 3.0))
def test_recency_is_monotone_in_age(ages, decay):
    a = torch.tensor(sorted(ages), dtype=torch.float64)
    r = hermes.recency_scores(a, decay)
    assert bool((r[1:] <= r[:-1]).all())
    assert bool(((r > 0) | (a * decay > 700)).all()) and bool((r <= 1).all())
    if ages and min(ages) == 0:
        assert float(r[0]) == 1.0


def test_omega_goes_linearly_from_recency_to_attention():
    # Middle layers 2..6: omega 1, 0.75, 0.5, 0.25, 0.
    assert [hermes.omega(layer, 2, 6) for layer in range(2, 7)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert hermes.omega(4, 2, 6, omega0=1.0, gamma=0.9) == pytest.approx(0.55)
    assert hermes.omega(3, 3, 3) == 0.5  # a lone middle layer sits halfway
    assert hermes.omega(2, 2, 6, omega0=2.0) == 1.0  # clamped
    assert hermes.omega(6, 2, 6, gamma=3.0) == 0.0
    with pytest.raises(ValueError):
        hermes.omega(1, 3, 2)


# --- normalisation and per-layer scores ------------------------------------------------


def test_normalise_sums_to_one_and_is_zero_safe():
    torch.testing.assert_close(hermes.normalise(torch.tensor([1.0, 3.0])), torch.tensor([0.25, 0.75]))
    torch.testing.assert_close(hermes.normalise(torch.zeros(4)), torch.full((4,), 0.25))
    assert hermes.normalise(torch.zeros(0)).numel() == 0
    with pytest.raises(ValueError):
        hermes.normalise(torch.tensor([1.0, -1.0]))


def test_layer_scores_by_role():
    attn = torch.tensor([1.0, 0.0, 1.0])  # normalised: [0.5, 0, 0.5]
    rec = torch.tensor([1.0, 1.0, 2.0])  # normalised: [0.25, 0.25, 0.5]
    torch.testing.assert_close(hermes.layer_scores("shallow", None, rec, 0.3), torch.tensor([0.25, 0.25, 0.5]))
    torch.testing.assert_close(hermes.layer_scores("deep", attn, rec, 0.3), torch.tensor([0.5, 0.0, 0.5]))
    # 0.75 * [0.5, 0, 0.5] + 0.25 * [0.25, 0.25, 0.5]
    torch.testing.assert_close(hermes.layer_scores("middle", attn, rec, 0.25), torch.tensor([0.4375, 0.0625, 0.5]))
    torch.testing.assert_close(hermes.layer_scores("middle", None, rec, 1.0), torch.tensor([0.25, 0.25, 0.5]))
    with pytest.raises(ValueError):
        hermes.layer_scores("deep", None, rec, 0.0)
    with pytest.raises(ValueError):
        hermes.layer_scores("middle", None, rec, 0.5)
    with pytest.raises(ValueError):
        hermes.layer_scores("sensory", attn, rec, 0.5)


# --- cross-layer smoothing --------------------------------------------------------------


def test_smoothing_by_token_id_hand_computed():
    scores = [torch.tensor([0.2, 0.3, 0.5]), torch.tensor([0.6, 0.1, 0.3]), torch.tensor([1.0])]
    ids = [torch.tensor([10, 11, 12]), torch.tensor([12, 10, 13]), torch.tensor([5])]
    out = hermes.cross_layer_smooth(scores, ids, [0.5, 0.25, 0.0])
    # Layer 0 reads layer 1 at ids 10, 11, 12: 0.1, absent (0), 0.6.
    torch.testing.assert_close(out[0], torch.tensor([0.15, 0.15, 0.55]))
    # Layer 1's tokens are all absent from layer 2.
    torch.testing.assert_close(out[1], torch.tensor([0.45, 0.075, 0.225]))
    assert torch.equal(out[2], scores[2])


def test_smoothing_default_weights_follow_the_roles():
    assert hermes.smoothing_weights(hermes.layer_roles(10)) == [0.1] + [0.3] * 6 + [0.4] * 2 + [0.0]
    scores = [torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])]
    ids = [torch.tensor([0, 1]), torch.tensor([0, 1])]
    out = hermes.cross_layer_smooth(scores, ids)  # roles middle, deep -> lam 0.3
    torch.testing.assert_close(out[0], torch.tensor([0.7, 0.3]))
    assert hermes.cross_layer_smooth([], []) == []


def test_smoothing_rejects_duplicate_ids_and_bad_weights():
    s = [torch.ones(2), torch.ones(2)]
    with pytest.raises(ValueError):
        hermes.cross_layer_smooth(s, [torch.tensor([0, 1]), torch.tensor([3, 3])], [0.5, 0.0])
    with pytest.raises(ValueError):
        hermes.cross_layer_smooth(s, [torch.tensor([0, 1]), torch.tensor([0, 1])], [1.5, 0.0])
    with pytest.raises(ValueError):
        hermes.cross_layer_smooth(s, [torch.tensor([0, 1]), torch.tensor([0, 1])], [0.5])


@st.composite
def layered_scores(draw):
    n_layers = draw(st.integers(1, 5))
    lam = [draw(st.floats(0.0, 1.0)) for _ in range(n_layers)]
    scores, ids = [], []
    for _ in range(n_layers):
        layer_ids = draw(st.lists(st.integers(0, 15), max_size=10, unique=True))
        scores.append([draw(st.floats(0.0, 1.0)) for _ in layer_ids])
        ids.append(layer_ids)
    return scores, ids, lam


@FAST
@given(layered_scores())
def test_smoothing_matches_a_dict_reference_and_is_a_convex_mix(case):
    scores, ids, lam = case
    s_t = [torch.tensor(s, dtype=torch.float64) for s in scores]
    i_t = [torch.tensor(i, dtype=torch.int64) for i in ids]
    out = hermes.cross_layer_smooth(s_t, i_t, lam)
    assert len(out) == len(scores)
    assert torch.equal(out[-1], s_t[-1])  # the last layer is unchanged
    for layer in range(len(scores) - 1):
        nxt = dict(zip(ids[layer + 1], scores[layer + 1]))
        for j, (tid, s) in enumerate(zip(ids[layer], scores[layer])):
            other = nxt.get(tid, 0.0)
            ref = (1 - lam[layer]) * s + lam[layer] * other
            got = float(out[layer][j])
            assert got == pytest.approx(ref, abs=1e-12)
            assert min(s, other) - 1e-12 <= got <= max(s, other) + 1e-12


# --- summary token ---------------------------------------------------------------------


def _identity(keys, delta):
    return keys


def test_summary_token_means_hand_computed():
    keys = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]])  # (H=1, N=2, D=2)
    values = torch.tensor([[[0.0, 1.0], [2.0, 5.0]]])
    k, v, count = hermes.summary_token(keys, values, torch.tensor([3, 7]), 10, _identity)
    torch.testing.assert_close(k, torch.tensor([[2.0, 3.0]]))
    torch.testing.assert_close(v, torch.tensor([[1.0, 3.0]]))
    assert count == 2
    # One more token folded into that summary: count-weighted, (2 * mean + new) / 3.
    k2, v2, c2 = hermes.summary_token(
        torch.tensor([[[5.0, 0.0]]]), torch.tensor([[[4.0, 4.0]]]), torch.tensor([8]), 10, _identity, (k, v, count)
    )
    torch.testing.assert_close(k2, torch.tensor([[3.0, 2.0]]))
    torch.testing.assert_close(v2, torch.tensor([[2.0, 10.0 / 3.0]]))
    assert c2 == 3


def test_summary_token_rotates_each_key_by_target_minus_position():
    seen = []

    def record(keys, delta):
        seen.append(delta.clone())
        return keys

    keys = torch.zeros(2, 3, 4)
    hermes.summary_token(keys, keys, torch.tensor([5, 9, 20]), 12, record)
    assert torch.equal(seen[0], torch.tensor([7, 3, -8]))


def test_summary_token_with_nothing_to_fold():
    prev = (torch.ones(2, 4), torch.zeros(2, 4), 3)
    empty = torch.zeros(2, 0, 4)
    assert hermes.summary_token(empty, empty, torch.zeros(0, dtype=torch.int64), 5, _identity, prev) is prev
    with pytest.raises(ValueError):
        hermes.summary_token(empty, empty, torch.zeros(0, dtype=torch.int64), 5, _identity)


def test_reference_rotation_hand_computed():
    # One pair (x, y) = (1, 0), f = pi/2: a move of 1 turns it a quarter, to (0, 1); of 2, to (-1, 0).
    k = torch.tensor([[1.0, 0.0], [1.0, 0.0]], dtype=torch.float64)  # (T=2, D=2)
    got = rotate_keys(k, torch.tensor([1, 2]), torch.tensor([math.pi / 2], dtype=torch.float64))
    torch.testing.assert_close(got, torch.tensor([[0.0, 1.0], [-1.0, 0.0]], dtype=torch.float64), rtol=0, atol=1e-12)


def _random_inv_freq(d: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(d // 2, generator=g, dtype=torch.float64) * 0.9 + 0.01  # (D/2,)


@FAST
@given(st.integers(1, 3), st.integers(1, 12), st.integers(0, 12), st.integers(0, 2000), st.integers(0, 10**6))
def test_summary_token_incremental_equals_all_at_once(h, n, split, target, seed):
    split = min(split, n)
    g = torch.Generator().manual_seed(seed)
    d = 8
    keys = torch.randn(h, n, d, generator=g, dtype=torch.float64)
    values = torch.randn(h, n, d, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 2000, (n,), generator=g)
    inv_freq = _random_inv_freq(d, seed)

    def rotate(k, delta):
        return rotate_keys(k, delta, inv_freq)

    once = hermes.summary_token(keys, values, pos, target, rotate)
    first = hermes.summary_token(keys[:, :split], values[:, :split], pos[:split], target, rotate) if split else None
    both = hermes.summary_token(keys[:, split:], values[:, split:], pos[split:], target, rotate, first)
    assert both[2] == once[2] == n
    torch.testing.assert_close(both[0], once[0], rtol=0, atol=1e-10)
    torch.testing.assert_close(both[1], once[1], rtol=0, atol=1e-12)


@FAST
@given(st.integers(1, 10), st.integers(0, 3000), st.integers(0, 10**6))
def test_summary_key_equals_the_mean_key_encoded_at_the_target(n, target, seed):
    # Pre-RoPE keys k0 encoded at scattered positions are post-RoPE R(p) k0. Folding them
    # at ``target`` must give the mean of the keys a forward would make at ``target``.
    g = torch.Generator().manual_seed(seed)
    h, d = 2, 16
    inv_freq = _random_inv_freq(d, seed + 1)
    k0 = torch.randn(h, n, d, generator=g, dtype=torch.float64)  # (H, N, D) pre-RoPE
    pos = torch.randint(0, 3000, (n,), generator=g)
    cached = rotate_keys(k0, pos, inv_freq)  # (H, N, D) post-RoPE at pos

    def rotate(k, delta):
        return rotate_keys(k, delta, inv_freq)

    k, v, count = hermes.summary_token(cached, k0, pos, target, rotate)
    at_target = rotate_keys(k0, torch.full((n,), target), inv_freq).mean(dim=1)  # (H, D)
    torch.testing.assert_close(k, at_target, rtol=0, atol=1e-9)
    torch.testing.assert_close(v, k0.mean(dim=1), rtol=0, atol=1e-12)
    assert count == n


# --- pseudo-query attention -------------------------------------------------------------


def test_pseudo_query_attention_hand_computed():
    # One head, one query token [1, 0]; keys [0, 0] and [ln 3, 0]: weights 1/4, 3/4.
    q = torch.tensor([[[1.0, 0.0]]])
    k = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0]]])
    torch.testing.assert_close(hermes.pseudo_query_attention(q, k, 1.0), torch.tensor([0.25, 0.75]))


@FAST
@given(st.sampled_from([(1, 1), (2, 1), (4, 2), (6, 3)]), st.integers(1, 4), st.integers(0, 9), st.integers(0, 10**6))
def test_pseudo_query_attention_matches_a_loop_reference(heads, n_q, n_cached, seed):
    hq, hkv = heads
    g = torch.Generator().manual_seed(seed)
    d = 4
    q = torch.randn(hq, n_q, d, generator=g, dtype=torch.float64)
    k = torch.randn(hkv, n_cached, d, generator=g, dtype=torch.float64)
    scale = d**-0.5
    got = hermes.pseudo_query_attention(q, k, scale)
    assert got.shape == (n_cached,)
    if n_cached == 0:
        return
    ref = torch.zeros(n_cached, dtype=torch.float64)
    for head in range(hq):
        kv = k[head // (hq // hkv)]  # transformers' repeat_kv grouping
        for i in range(n_q):
            logits = [float(q[head, i] @ kv[j]) * scale for j in range(n_cached)]
            m = max(logits)
            e = [math.exp(x - m) for x in logits]
            for j in range(n_cached):
                ref[j] += e[j] / sum(e) / (hq * n_q)
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-12)
    assert float(got.sum()) == pytest.approx(1.0, abs=1e-12)


def test_pseudo_query_attention_rejects_bad_gqa():
    with pytest.raises(ValueError):
        hermes.pseudo_query_attention(torch.zeros(3, 1, 4), torch.zeros(2, 5, 4), 1.0)
