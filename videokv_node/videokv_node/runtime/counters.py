"""The node's counters of frames and questions (plain numbers, no ROS), read by ``~/memory_stats`` and ``/diagnostics``."""

from __future__ import annotations

import threading


class Counters:
    """The node's counters of frames and questions, for ``~/memory_stats`` and ``/diagnostics``; thread-safe."""

    KEYS = ("received", "sampled", "dropped", "answered", "failed")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self.KEYS, 0)

    def add(self, key: str) -> None:
        """One more ``key`` (one of KEYS)."""
        with self._lock:
            self._counts[key] += 1

    def read(self) -> dict[str, int]:
        """A copy of all the counts, taken at once."""
        with self._lock:
            return dict(self._counts)

    def reset(self) -> None:
        """Every count back to zero (a new configuration)."""
        with self._lock:
            self._counts = dict.fromkeys(self.KEYS, 0)
