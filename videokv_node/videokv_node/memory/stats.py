"""A snapshot of the memory, safe to read from any thread."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class EngineStats:
    policy: str
    frames_ingested: int  # camera frames handed to the engine (merged still frames included)
    frames_evicted: int  # blocks removed for good by caps or compression (one per frame for full, rekv, hermes)
    frames_in_memory: int  # blocks held, resident + offloaded (MuKV holds several per frame; summaries count)
    tokens_resident: int  # sink + resident blocks, in tokens' worth over all layers (entries / n_layers, rounded up)
    tokens_offloaded: int
    bytes_resident: int  # exact: every kept (token, layer) entry
    bytes_offloaded: int
    budget_tokens: int
    budget_offload_bytes: int  # the host arena's real capacity (offload_bytes rounded down to pages)
    oldest_stamp_ns: int  # 0 when empty
    newest_stamp_ns: int
    ingest_ms_p50: float
    ingest_ms_p95: float
    # StreamKV's open segment, outside the figures above (0 for every other policy): its members'
    # features (merged frames once) plus their cached KV. The engine demotes older blocks to keep that KV
    # within budget_tokens too, but never the encoding window, so the two together may exceed it by the
    # cache's size past the room the window leaves (at most M frames; memory.streamkv.max_segment_s).
    streamkv_open_segment_bytes: int = 0
    frames_merged: int = 0  # still frames merged into a stored frame's span, not encoded (memory.redundancy; issue 36)


class LatencyWindow:
    """Percentiles over the last ``size`` samples: a bounded window, never a growing list."""

    def __init__(self, size: int = 256) -> None:
        self._samples: deque[float] = deque(maxlen=size)

    def add(self, value: float) -> None:
        self._samples.append(value)

    def percentile(self, q: float) -> float:
        if not self._samples:
            return 0.0
        return float(np.percentile(np.fromiter(self._samples, float), q))

    def clear(self) -> None:
        self._samples.clear()
