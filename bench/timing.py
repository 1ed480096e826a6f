"""Durations and their summaries.

Every duration is ``time.perf_counter`` around the call measured (or the
engine's own ``Answer.ttft_s``/``total_s``, which are perf_counter too). Warm-up
samples are dropped by the caller before summarising; a summary never sees them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Summary:
    """Percentiles of a list of durations, in milliseconds (numpy's linear interpolation)."""

    n: int  # samples summarised (warm-up excluded)
    p50_ms: float
    p95_ms: float  # with few samples this is close to the maximum: read it with ``n``

    @classmethod
    def of(cls, seconds: Sequence[float]) -> "Summary":
        if not seconds:
            raise ValueError("no samples to summarise")
        ms = np.asarray(seconds, dtype=np.float64) * 1e3
        return cls(len(ms), float(np.percentile(ms, 50)), float(np.percentile(ms, 95)))

    def cell(self, digits: int = 1) -> str:
        """``p50 / p95`` for a table cell."""
        return f"{self.p50_ms:.{digits}f} / {self.p95_ms:.{digits}f}"


class CallTimer:
    """Times each call of one method of one object by shadowing it on the instance.

    The class and every other instance are untouched; ``close`` removes the
    shadow. ``last_s`` is the duration of the latest call, so a caller timing an
    outer call can split it exactly (outer - inner) per call, not per median.
    """

    def __init__(self, obj: object, method: str) -> None:
        self._obj, self._method = obj, method
        inner = getattr(obj, method)
        self.last_s = 0.0

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.last_s = time.perf_counter() - t0

        setattr(obj, method, timed)

    def close(self) -> None:
        delattr(self._obj, self._method)

    def __enter__(self) -> "CallTimer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
