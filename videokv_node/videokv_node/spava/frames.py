"""Frame parallelism (paper sections 3.1 and 4.1): each rank encodes a share of the frames, all ranks gather all.

Frames are dealt out over the 2W virtual hosts as evenly as the context is
(virtual host v gets floor(N / 2W) + [v < N mod 2W] consecutive frames, eq. 6),
and rank r encodes the frames of its two virtual hosts, the same pairing as the
context blocks. The gather pads every rank's share to the largest one (an
all-gather needs equal sizes) and puts frames back in time order.
"""

from __future__ import annotations

import torch

from videokv_node.spava.collectives import PendingGather
from videokv_node.spava.layout import even_split, virtual_blocks_of


def frame_indices(n_frames: int, world: int, rank: int, zigzag: bool = True) -> list[int]:
    """Indices (ascending) of the frames ``rank`` encodes."""
    sizes = even_split(n_frames, 2 * world)
    starts = [sum(sizes[:v]) for v in range(2 * world)]
    return [i for v in virtual_blocks_of(rank, world, zigzag) for i in range(starts[v], starts[v] + sizes[v])]


def gather_frame_embeddings(local: torch.Tensor, n_frames: int, world: int, rank: int, group,
                            timeout_s: float, zigzag: bool = True) -> torch.Tensor:
    """Every rank's (F_r, T, hidden) embeddings -> (n_frames, T, hidden) in frame order, on every rank."""
    shares = [frame_indices(n_frames, world, r, zigzag) for r in range(world)]
    if local.shape[0] != len(shares[rank]):
        raise ValueError(f"rank {rank} encoded {local.shape[0]} frames, its share is {len(shares[rank])}")
    most = max(len(s) for s in shares)
    padded = local.new_zeros((most, *local.shape[1:]))
    padded[: local.shape[0]] = local
    parts = PendingGather("frame embeddings", padded, group, world, rank, timeout_s, overlap=False).wait()
    out = local.new_empty((n_frames, *local.shape[1:]))
    for r, idx in enumerate(shares):
        out[idx] = parts[r][: len(idx)]
    return out
