"""Exact re-rotation of RoPE keys.

A transformers KV cache stores keys *after* the rotary embedding, rotated to the
position each token had when it was encoded. Moving a token to another position
is a rotation by the difference: R(p + d) k = R(d) R(p) k, because rotations of
one frequency compose additively. So a key encoded at ``p`` and re-rotated by
``d`` is, up to float rounding, the key a plain forward would have produced at
``p + d``. This is what lets the memory keep positions per token and still place
retrieved blocks anywhere (tests/unit/test_rope.py checks it against a forward).
"""

from __future__ import annotations

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The ``rotate_half`` convention of Llama/Qwen2 in transformers (not interleaved)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_keys(keys: torch.Tensor, delta: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Rotate post-RoPE ``keys`` by ``delta`` positions, per token.

    keys:     (..., T, D) keys already rotated at some positions p_t.
    delta:    (T,) integer position change per token (may be negative).
    inv_freq: (D/2,) the rotary inverse frequencies of the model.
    Returns keys rotated to p_t + delta_t, same shape and dtype.

    The rotation is computed in float32 (float64 for float64 keys) and uses no
    ``attention_scaling`` factor: that factor was applied once when the key was
    made, a pure rotation must not apply it again.
    """
    work = torch.float64 if keys.dtype == torch.float64 else torch.float32
    freqs = delta.to(keys.device, work)[:, None] * inv_freq.to(keys.device, work)[None, :]  # (T, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, D)
    cos, sin = emb.cos(), emb.sin()
    k = keys.to(work)
    return (k * cos + rotate_half(k) * sin).to(keys.dtype)
