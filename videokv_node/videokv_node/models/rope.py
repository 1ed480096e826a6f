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


def mrope_rows(mrope_section: list[int] | tuple[int, ...]) -> torch.Tensor:
    """(D/2,) which position row (0 = t, 1 = h, 2 = w) drives each rotary frequency under mRoPE.

    transformers' Qwen2-VL/Qwen2.5-VL rotary splits the D/2 frequencies into
    consecutive chunks of ``mrope_section`` sizes and takes chunk ``i`` from row
    ``i % 3`` (``recomposition_frequencies``); the same half is then repeated for
    the ``rotate_half`` layout, as in 1-D RoPE.
    """
    return torch.cat([torch.full((size,), i % 3, dtype=torch.long) for i, size in enumerate(mrope_section)])


def rotate_keys_mrope(
    keys: torch.Tensor, delta3: torch.Tensor, inv_freq: torch.Tensor, mrope_section: list[int] | tuple[int, ...]
) -> torch.Tensor:
    """Rotate post-mRoPE ``keys`` by per-row position deltas, per token.

    keys:          (..., T, D) keys already rotated at some 3-D positions (t, h, w).
    delta3:        (3, T) integer change of each position row per token (may be negative).
    inv_freq:      (D/2,) the rotary inverse frequencies of the model.
    mrope_section: frequencies per row chunk, summing to D/2 (e.g. [16, 24, 24]).
    Returns keys rotated to p + delta3, same shape and dtype.

    Exact for the same reason as ``rotate_keys``: frequency ``j`` is a plain 2-D
    rotation by (its row's position) * inv_freq[j], so moving that row by ``d``
    composes as a rotation by d * inv_freq[j]. With equal rows this is ``rotate_keys``.
    """
    rows = mrope_rows(mrope_section).to(keys.device)  # (D/2,)
    if rows.numel() != inv_freq.numel():
        raise ValueError(
            f"mrope_section {list(mrope_section)} covers {rows.numel()} frequencies, the model has {inv_freq.numel()}"
        )
    if delta3.dim() != 2 or delta3.shape[0] != 3 or delta3.shape[1] != keys.shape[-2]:
        raise ValueError(f"delta3 must be (3, T={keys.shape[-2]}), got {tuple(delta3.shape)}")
    work = torch.float64 if keys.dtype == torch.float64 else torch.float32
    per_freq = delta3.to(keys.device, work)[rows].T  # (T, D/2): the delta of the row that drives each frequency
    freqs = per_freq * inv_freq.to(keys.device, work)[None, :]  # (T, D/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, D)
    cos, sin = emb.cos(), emb.sin()
    k = keys.to(work)
    return (k * cos + rotate_half(k) * sin).to(keys.dtype)
