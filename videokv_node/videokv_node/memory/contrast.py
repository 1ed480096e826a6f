"""Temporal contrast of the retrieval index's mean keys (``memory.rekv.contrast``; ours, not ReKV's).

ReKV scores a block by its mean pre-RoPE key against the question's mean query. On an hour of real
footage (issue 32) that score is decided by what a frame shares with its shot: every frame of a
still stretch or a pan scores nearly alike, and the shot whose view happens to align with the
query fills the top; a thing drawn into one or two frames of a shot moves the frame's mean key
far less than the shot does. Measured (docs/notes/2026-11-27-issue32-robots-hour.md, "Where the
things rank"): with the node's default encoding the things' frames ranked 230th of ~1,780 (median)
under the fused ranking, none among the 18 retrieved, and 14 of 24 among them once each mean key
had the mean of its neighbours in time taken away (w = 3).

So, with ``w`` > 0, each block is scored by its **contrasted** mean key: its own minus the mean of
the mean keys of the ``w`` blocks before and the ``w`` after it, among the held blocks of the same
camera and the same encoding stream (MuKV's granularities, StreamKV's summaries are streams of
their own), in creation order; fewer at either end of that sequence. A block with no neighbour
keeps its own mean key. What the block shares with its stretch cancels; what only it shows stays.
The query is unchanged, so a layer's score is still a query-key dot product (ReKV's unit).

Guarantees: ``contrasted_key_means(index, slots, 0)`` is exactly the slots' mean keys; otherwise the
result depends only on what the index holds (never on a question's candidate mask or time window),
so a question and ``~/locate`` score a block alike. Cost: O(held blocks) per call (one gather, one
cumulative sum), as the ranking itself; nothing is stored.
"""

from __future__ import annotations

import torch


def contrasted_key_means(index, slots: torch.Tensor, w: int) -> torch.Tensor:
    """(L, n, H, D) float32: the mean keys of ``slots`` ((n,) long, held slots of ``index``), each minus the
    mean of its up to ``w`` neighbours on each side (module doc); ``w`` 0: the mean keys as held."""
    if w < 0:
        raise ValueError(f"contrast window must be >= 0, got {w}")
    if w == 0 or slots.numel() == 0:
        return index.key_mean.index_select(1, slots)
    held = index.ordered()  # (M,) held slots, creation order
    group = index.camera.index_select(0, held) * (len(index._codes) + 1) + index.stream.index_select(0, held)
    group, perm = torch.sort(group, stable=True)  # grouped by (camera, stream), creation order inside a group
    seq = held.index_select(0, perm)  # (M,)
    _, counts = torch.unique_consecutive(group, return_counts=True)
    ends = torch.cumsum(counts, 0)
    start = torch.repeat_interleave(ends - counts, counts)  # (M,) where each one's group starts
    end = torch.repeat_interleave(ends, counts)  # (M,) and ends (exclusive)
    at = torch.arange(seq.numel(), device=seq.device)
    lo, hi = torch.maximum(at - w, start), torch.minimum(at + w + 1, end)  # the window [lo, hi), itself inside
    keys = index.key_mean.index_select(1, seq).double()  # (L, M, H, D); float64: differences of long sums
    csum = torch.cat([torch.zeros_like(keys[:, :1]), torch.cumsum(keys, 1)], 1)  # (L, M + 1, H, D)
    n_neigh = (hi - lo - 1).view(1, -1, 1, 1)  # (1, M, 1, 1) neighbours besides itself
    neigh = (csum.index_select(1, hi) - csum.index_select(1, lo) - keys) / n_neigh.clamp_min(1)
    contrasted = torch.where(n_neigh > 0, keys - neigh, keys).float()
    where = torch.full((index.capacity,), -1, dtype=torch.long, device=seq.device)
    where[seq] = at
    rows = where.index_select(0, slots)
    if bool((rows < 0).any()):
        raise ValueError("contrasted_key_means: a slot that holds no block")
    return contrasted.index_select(1, rows)
