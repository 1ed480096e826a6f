"""Pooling of the frozen encoder's maps and of a frame's pixels to a grid, shared by ``videokv-tiny``'s projector
(``models/videokv_tiny.py``) and its drawn-things head (``models/things_head.py``): matrix products and
reductions only, so the vision backends' ONNX export carries them."""

from __future__ import annotations

import torch


def pool_matrix(n_in: int, n_out: int, like: torch.Tensor) -> torch.Tensor:
    """(n_out, n_in): row i averages inputs [floor(i n_in / n_out), ceil((i + 1) n_in / n_out)), the
    regions of ``adaptive_avg_pool``."""
    m = torch.zeros(n_out, n_in, dtype=like.dtype, device=like.device)
    for i in range(n_out):
        start, end = (i * n_in) // n_out, -(-(i + 1) * n_in // n_out)
        m[i, start:end] = 1.0 / (end - start)
    return m


def grid_pool(x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(B, C, h, w) -> (B, C, rows, cols): ``F.adaptive_avg_pool2d(x, grid)`` as two matrix products.

    Why: ONNX cannot export adaptive pooling of a map whose size it does not know statically
    (the encoder's SAME padding hides it), so the vision backends could not serve this model.
    A frame's map size is fixed by the model's image size, so the matrices are constants of an
    exported graph (``int`` of the traced size); in eager mode they are rebuilt per call (tiny).
    """
    h, w = (int(v) for v in x.shape[-2:])
    return pool_matrix(h, grid[0], x) @ x @ pool_matrix(w, grid[1], x).T


COLOUR_STATS = 4  # per cell: the chroma-squared-weighted mean R, G, B and the mean chroma (colour_statistics)


def colour_statistics(pixels: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(B, 3, H, W) RGB in [0, 1] -> (B, COLOUR_STATS, rows, cols): per cell of the grid, the mean colour of
    its pixels weighted by their chroma squared (max - min channel), and the cell's mean chroma.

    Why (videokv-tiny v4, issue 14): an average-pooled cell of the encoder's maps mixes a shape with the
    backdrop around it, and on textured or photo backdrops the v3 candidates could not name the colour of a
    free shape even on the renders they were trained on (0.30). Saturated pixels dominate the weighted
    mean, so it is the colour of what is coloured in the cell whatever the (unsaturated) backdrop; a
    linear probe on these statistics named held-out shapes' colours at 0.88 (an MLP 0.97), one on the
    pooled maps 0.76
    (docs/notes/2026-11-25-issue14-videokv-tiny-v4.md#reading-the-videokv-tiny-tables-issue-14-hand-written-not-generated).
    Matrix products and reductions only, so it exports to ONNX with the encoder.
    """
    chroma = (pixels.amax(1, keepdim=True) - pixels.amin(1, keepdim=True))  # (B, 1, H, W)
    weight = chroma * chroma
    mean_rgb = grid_pool(pixels * weight, grid) / (grid_pool(weight, grid) + 1e-4)
    return torch.cat([mean_rgb, grid_pool(chroma, grid)], 1)
