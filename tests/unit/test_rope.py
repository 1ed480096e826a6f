"""Re-rotating cached keys by a position delta equals encoding at the shifted positions."""

from __future__ import annotations

import torch

from tests.unit.helpers import plain_forward, random_frames


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
