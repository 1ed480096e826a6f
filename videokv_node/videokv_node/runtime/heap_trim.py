"""Give the C heap's free pages back to the OS when the process has grown: RSS stays flat.

Why: the engine's transient tensors (a frame's placed window, a question's context: a few MiB
each, growing with the window) are served from glibc's heap once its dynamic mmap threshold
has risen past them, and small long-lived tensors (the blocks' K/V, 60 per frame) land between
them: the heap's free space is fragmented and never returned. Under four cameras the node's RSS
grew 12-14% over the second half of the load against its KV (docs/bench/load.md);
``MALLOC_MMAP_THRESHOLD_`` flattens it but gives every large transient a fresh mapping to fault
in, and ingest slowed by a quarter. ``malloc_trim(0)`` releases the free pages inside the heap
too (glibc >= 2.8, ``madvise(MADV_DONTNEED)``), without moving anything.

Bounded: a trim runs only when RSS grew by more than ``max_growth_bytes`` since the last one,
so RSS stays within that of what is in use and the cost (a walk of the heap's free chunks,
about 15 ms at a 800 MiB heap; docs/bench/load.md) is paid once every few batches. Reading
RSS is one small read of ``/proc/self/statm``. Where there is no glibc (or no ``/proc``) it
does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import time


def _libc_trim():
    """glibc's ``malloc_trim`` or None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def rss_bytes() -> int | None:
    """The process's resident set size, or None where ``/proc`` is missing."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class HeapTrim:
    """``maybe_trim()`` after a unit of work (an ingest batch, a question): trims when RSS grew by
    more than ``max_growth_bytes`` since the last trim (or construction). 0 turns it off.

    Counters (``trims``, ``trim_s``: time spent in ``malloc_trim``) are written by the calling
    thread only; reading them elsewhere gives a recent value.
    """

    def __init__(self, max_growth_bytes: int = 16 << 20) -> None:
        if max_growth_bytes < 0:
            raise ValueError(f"max_growth_bytes must be >= 0, got {max_growth_bytes}")
        self.max_growth_bytes = max_growth_bytes
        self._trim = _libc_trim() if max_growth_bytes else None
        self._base = rss_bytes() if self._trim is not None else None
        self.trims = 0
        self.trim_s = 0.0

    @property
    def active(self) -> bool:
        return self._trim is not None and self._base is not None

    def maybe_trim(self) -> bool:
        """Trim if RSS grew past the bound; returns True when it trimmed."""
        trim, base = self._trim, self._base
        if trim is None or base is None:  # not ``active``
            return False
        rss = rss_bytes()
        if rss is None or rss - base <= self.max_growth_bytes:
            return False
        t = time.perf_counter()
        trim(0)
        self.trim_s += time.perf_counter() - t
        self.trims += 1
        self._base = rss_bytes() or rss
        return True
