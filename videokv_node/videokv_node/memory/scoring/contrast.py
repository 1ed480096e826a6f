"""Temporal contrast of blocks' mean keys (``memory.rekv.contrast``; ours, not ReKV's).

ReKV scores a block by its mean pre-RoPE key against the question's mean query. On an hour of real
footage (issue 32) that score is decided by what a frame shares with its shot: every frame of a
still stretch or a pan scores nearly alike, and the shot whose view happens to align with the
query fills the top; a thing drawn into one or two frames of a shot moves the frame's mean key
far less than the shot does. Measured (docs/notes/2026-11-27-issue32-robots-hour.md, "Where the
things rank"): with the node's default encoding the things' frames ranked 230th of ~1,780 (median)
under the fused ranking, none among the 18 retrieved, and 14 of 24 among them once each mean key
had the mean of its neighbours in time taken away (w = 3).

So, with ``w`` > 0, each block is scored by its **contrasted** mean key: its own minus the mean of
the mean keys of the ``w`` blocks before and the ``w`` after it in its group (the held blocks of
one camera and one encoding stream: MuKV's granularities, StreamKV's summaries are streams of their
own), in creation order; fewer at either end of the group. A block with no neighbour keeps its own
mean key. What the block shares with its stretch cancels; what only it shows stays. The query is
unchanged, so a layer's score is still a query-key dot product (ReKV's unit).

Plain tensors in, plain tensors out (``scoring/`` convention); ``BlockIndex.contrasted_key_means``
gathers the held blocks for it, so a block's contrast depends only on what the index holds (never
on a question's candidate mask or time window) and a question and ``~/locate`` score a block alike.
Cost: one cumulative sum over the held blocks, O(N) as the ranking itself; nothing stored.
"""

from __future__ import annotations

import torch


def temporal_contrast(keys: torch.Tensor, groups: torch.Tensor, w: int) -> torch.Tensor:
    """(L, M, H, D) float32: ``keys`` ((L, M, H, D), the M blocks sorted by group, creation order inside
    a group; ``groups`` (M,) their group codes, equal codes adjacent) each less the mean of its up to
    ``w`` neighbours on each side within its group (module doc); ``w`` 0: ``keys`` as given."""
    if w < 0:
        raise ValueError(f"contrast window must be >= 0, got {w}")
    if w == 0 or keys.shape[1] == 0:
        return keys.float()
    _, counts = torch.unique_consecutive(groups, return_counts=True)
    ends = torch.cumsum(counts, 0)
    start = torch.repeat_interleave(ends - counts, counts)  # (M,) where each one's group starts
    end = torch.repeat_interleave(ends, counts)  # (M,) and ends (exclusive)
    at = torch.arange(keys.shape[1], device=keys.device)
    lo, hi = torch.maximum(at - w, start), torch.minimum(at + w + 1, end)  # the window [lo, hi), itself inside
    k64 = keys.double()  # float64: differences of long running sums
    csum = torch.cat([torch.zeros_like(k64[:, :1]), torch.cumsum(k64, 1)], 1)  # (L, M + 1, H, D)
    n_neigh = (hi - lo - 1).view(1, -1, 1, 1)  # (1, M, 1, 1) neighbours besides itself
    neigh = (csum.index_select(1, hi) - csum.index_select(1, lo) - k64) / n_neigh.clamp_min(1)
    return torch.where(n_neigh > 0, k64 - neigh, k64).float()
