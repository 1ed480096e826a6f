"""Host memory for offloaded KV, allocated once and never grown.

A robot runs for days: the offload tier must have a fixed footprint decided at
start, not a heap that fragments. The arena is a fixed array of pages; a page
holds ``page_tokens`` tokens of *one layer* (K and V of every KV head), so
blocks compressed differently per layer cost exactly what they keep. A layer's
tokens take ceil(t / page_tokens) pages, in any order (gathered by index).
"""

from __future__ import annotations

import torch

from videokv_node.models.adapter import KVGeometry


class HostKVArena:
    """Fixed pool of one-layer KV pages in host RAM.

    Invariants: ``free_pages + used_pages == n_pages`` always; a page belongs to
    at most one block layer; ``capacity_bytes <= offload_bytes`` given at construction.
    """

    def __init__(self, geometry: KVGeometry, offload_bytes: int, page_tokens: int) -> None:
        self.geometry = geometry
        self.page_tokens = page_tokens
        self.page_bytes = page_tokens * geometry.bytes_per_token // geometry.n_layers
        self.n_pages = offload_bytes // self.page_bytes
        shape = (self.n_pages, geometry.n_kv_heads, page_tokens, geometry.head_dim)
        # torch.empty: the OS commits pages only when written, so a large cap costs nothing until used.
        self._keys = torch.empty(shape, dtype=geometry.dtype)  # (P, H, page, D)
        self._values = torch.empty(shape, dtype=geometry.dtype)
        self._free: list[int] = list(range(self.n_pages - 1, -1, -1))  # a stack: lowest pages first, then the last freed

    @property
    def capacity_bytes(self) -> int:
        return self.n_pages * self.page_bytes

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def used_pages(self) -> int:
        return self.n_pages - len(self._free)

    def pages_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.page_tokens)

    def can_store(self, n_pages: int) -> bool:
        return n_pages <= len(self._free)

    def store(self, keys: torch.Tensor, values: torch.Tensor) -> list[int]:
        """Copy one layer's (H, t, D) K/V into free pages; raises MemoryError when they do not fit."""
        n_tokens = keys.shape[1]
        n = self.pages_for(n_tokens)
        if n > len(self._free):
            raise MemoryError(f"host arena full: need {n} pages, {len(self._free)} free")
        pages = [self._free.pop() for _ in range(n)]
        pad = n * self.page_tokens - n_tokens
        for src, dst in ((keys, self._keys), (values, self._values)):
            src = torch.nn.functional.pad(src, (0, 0, 0, pad)) if pad else src  # (H, n * page, D)
            paged = src.reshape(src.shape[0], n, self.page_tokens, src.shape[2]).transpose(0, 1)  # (n, H, page, D)
            # A blocking copy: a non_blocking device-to-host copy returns before the data has
            # landed (into pinned memory), and the index_put below would read it unfinished.
            dst[torch.tensor(pages)] = paged.to("cpu")
        return pages

    def load(self, pages: list[int], n_tokens: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather one layer's pages -> (H, t, D) K and V on ``device``."""
        idx = torch.tensor(pages)
        out = []
        for src in (self._keys, self._values):
            paged = src[idx]  # (n, H, page, D)
            n, H, P, D = paged.shape
            flat = paged.transpose(0, 1).reshape(H, n * P, D)[:, :n_tokens]
            out.append(flat.to(device, non_blocking=True))
        return out[0], out[1]

    def free(self, pages: list[int]) -> None:
        if len(self._free) + len(pages) > self.n_pages:
            raise RuntimeError("double free of arena pages")
        self._free.extend(reversed(pages))
