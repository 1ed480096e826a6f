"""Re-rotating cached keys by a position delta equals encoding at the shifted positions."""

from __future__ import annotations

import pytest
import torch

from tests.unit.helpers import plain_forward, random_frames
from videokv_node.models.rope import mrope_rows, rotate_keys, rotate_keys_mrope


def test_shift_of_whole_sequence_rotates_every_key_exactly(tiny_adapter64):
    a = tiny_adapter64
    frames = random_frames(3)
    q = a.question_ids("what moved?", [])
    logits0, cache0 = plain_forward(a, frames, q, offset=0)
    logits1, cache1 = plain_forward(a, frames, q, offset=1000)
    # RoPE is relative: shifting every position changes no attention score, so no output.
    # transformers computes rotary angles in float32 even for a float64 model, so at position
    # ~1000 angles carry ~1e-5 relative error; that, not our rotation, sets these tolerances.
    torch.testing.assert_close(logits1, logits0, rtol=0, atol=1e-6)
    n = cache0.layers[0].keys.shape[2]
    delta = torch.full((n,), 1000)
    for layer0, layer1 in zip(cache0.layers, cache1.layers):
        torch.testing.assert_close(a.rotate_keys(layer0.keys, delta), layer1.keys, rtol=0, atol=2e-5)
        torch.testing.assert_close(layer0.values, layer1.values, rtol=0, atol=1e-6)


def test_rotation_by_per_token_deltas_composes_and_inverts(tiny_adapter64):
    a = tiny_adapter64
    g = torch.Generator().manual_seed(0)
    keys = torch.randn(2, 5, 16, generator=g, dtype=torch.float64)  # (H, T, D)
    d1 = torch.tensor([0, 3, -7, 100, 12345])
    d2 = torch.tensor([5, -3, 7, 1, -12345])
    once = a.rotate_keys(keys, d1 + d2)
    twice = a.rotate_keys(a.rotate_keys(keys, d1), d2)
    torch.testing.assert_close(once, twice, rtol=0, atol=1e-9)
    torch.testing.assert_close(a.rotate_keys(a.rotate_keys(keys, d1), -d1), keys, rtol=0, atol=1e-9)
    torch.testing.assert_close(a.rotate_keys(keys, torch.zeros(5, dtype=torch.long)), keys, rtol=0, atol=0)


# --- mRoPE (Qwen2-VL / Qwen2.5-VL) ----------------------------------------------
MROPE_SECTION = [2, 3, 3]


def test_mrope_rows_follow_transformers_frequency_split():
    """Frequency j is driven by the row transformers' ``recomposition_frequencies`` takes it from."""
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLTextConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLRotaryEmbedding

    rope = dict(rope_type="default", rope_theta=1e4, mrope_section=MROPE_SECTION)
    cfg = Qwen2_5_VLTextConfig(hidden_size=64, num_attention_heads=4, rope_parameters=rope)
    rotary = Qwen2_5_VLRotaryEmbedding(cfg)
    tagged = torch.arange(3.0).view(3, 1, 1, 1).expand(3, 1, 1, 8)  # (3, B, n, D/2): each entry names its row
    recomposed = rotary.recomposition_frequencies(tagged)[0, 0]  # (D,)
    rows = mrope_rows(MROPE_SECTION)
    assert torch.equal(recomposed, torch.cat([rows, rows]).to(recomposed.dtype))


def test_mrope_rotation_with_equal_rows_is_the_1d_rotation_and_composes():
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(2, 5, 16, generator=g, dtype=torch.float64)  # (H, T, D)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, 16, 2, dtype=torch.float64) / 16))  # (D/2,)
    d = torch.tensor([0, 3, -7, 100, 12345])
    same = rotate_keys_mrope(keys, d.expand(3, 5), inv_freq, MROPE_SECTION)
    torch.testing.assert_close(same, rotate_keys(keys, d, inv_freq), rtol=0, atol=1e-12)
    d1 = torch.randint(-500, 500, (3, 5), generator=g)
    d2 = torch.randint(-500, 500, (3, 5), generator=g)
    once = rotate_keys_mrope(keys, d1 + d2, inv_freq, MROPE_SECTION)
    twice = rotate_keys_mrope(rotate_keys_mrope(keys, d1, inv_freq, MROPE_SECTION), d2, inv_freq, MROPE_SECTION)
    torch.testing.assert_close(once, twice, rtol=0, atol=1e-9)
    back = rotate_keys_mrope(rotate_keys_mrope(keys, d1, inv_freq, MROPE_SECTION), -d1, inv_freq, MROPE_SECTION)
    torch.testing.assert_close(back, keys, rtol=0, atol=1e-9)
    # Moving only the w row leaves the t and h frequencies (the first 2 + 3 of each half) untouched.
    only_w = torch.zeros(3, 5, dtype=torch.long)
    only_w[2] = d1[2]
    moved = rotate_keys_mrope(keys, only_w, inv_freq, MROPE_SECTION)
    for lo in (0, 8):
        torch.testing.assert_close(moved[..., lo : lo + 5], keys[..., lo : lo + 5], rtol=0, atol=0)
    assert not torch.allclose(moved[..., 5:8], keys[..., 5:8])


def test_mrope_rotation_rejects_a_bad_section_or_delta():
    keys = torch.zeros(4, 16)
    inv_freq = torch.ones(8)
    with pytest.raises(ValueError, match="covers 7 frequencies"):
        rotate_keys_mrope(keys, torch.zeros(3, 4), inv_freq, [2, 2, 3])
    with pytest.raises(ValueError, match=r"must be \(3, T=4\)"):
        rotate_keys_mrope(keys, torch.zeros(4), inv_freq, MROPE_SECTION)
