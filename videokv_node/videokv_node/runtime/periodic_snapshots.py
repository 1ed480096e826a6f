"""``memory.snapshot_period_s``: a snapshot of the memory every period, so a crash loses one period at most.

The caller (the node) ticks it from a timer on its own clock, so periods and the names'
times follow ``use_sim_time``. Each tick:

1. on the model worker thread, between two frames: ``SnapshotSeries.prepare`` copies what is
   new since the previous snapshot (that copy is the only time ingest and questions wait);
2. on this object's own writer thread: ``SnapshotSeries.write`` serialises, fsyncs, links
   and renames it, then prunes to ``memory.snapshot_keep``.

At most one snapshot is in flight: a tick that finds one still being written, or the model's
request queue full (``WorkerBusy``), is skipped and counted, never queued behind it. A
failed write (disk full, directory gone or read-only) is counted with its reason; earlier
snapshots are untouched and the next one is written whole. No ROS here: the node turns
``status`` into a /diagnostics entry and ``~/memory_stats`` fields.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from videokv_node.memory.snapshot.format import SnapshotInfo
from videokv_node.memory.snapshot.series import SnapshotSeries
from videokv_node.runtime.worker import ModelWorker, WorkerBusy, WorkerStopped

STALE_PERIODS = 3  # WARN when the last good snapshot is older than this many periods


@dataclass(frozen=True, slots=True)
class SnapshotStatus:
    """Where periodic snapshots stand; times on the caller's clock (ns)."""

    ok: bool  # False: the last good snapshot is stale, or the last write failed
    message: str
    last_good_ns: int  # clock time the last good snapshot was taken (0: none yet)
    last_path: str  # its directory
    written: int  # good snapshots written since start
    failed: int  # writes that failed since start
    skipped: int  # ticks skipped (one still in flight, or the model's queue full)
    last_error: str  # reason of the last failure ('' if none)


class PeriodicSnapshotter:
    """Takes the series' snapshots on ``tick``; thread-safe (ticks from a timer, writes on its own thread)."""

    def __init__(self, series: SnapshotSeries, period_s: float, started_ns: int,
                 log: Callable[[str, str], None] = lambda level, text: None) -> None:
        if period_s <= 0:
            raise ValueError(f"period_s must be > 0, got {period_s}")
        self.series = series
        self.period_ns = int(period_s * 1e9)
        self._log = log  # log(level, text), level one of debug, info, warn, error
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="videokv-snapshot")
        self._lock = threading.Lock()
        self._in_flight = False
        self._since_ns = started_ns  # staleness counts from here until the first good snapshot
        self._last_good_ns = 0
        self._last_path = ""
        self._written = self._failed = self._skipped = 0
        self._last_error = ""
        self._failed_after_good = False

    def tick(self, now_ns: int, worker: ModelWorker, engine) -> bool:
        """Start a snapshot taken at ``now_ns`` unless one is in flight; True if one was started."""
        with self._lock:
            if self._in_flight:
                self._skipped += 1
                self._log("warn", "periodic snapshot skipped: the previous one is still being written "
                                  "(memory.snapshot_period_s shorter than a write)")
                return False
            self._in_flight = True
        try:
            future = worker.call(lambda: self.series.prepare(engine))
        except (WorkerBusy, WorkerStopped) as exc:
            with self._lock:
                self._in_flight = False
                self._skipped += 1
            self._log("warn", f"periodic snapshot skipped: {exc}")
            return False
        future.add_done_callback(lambda f: self._hand_over(f, now_ns))
        return True

    def _hand_over(self, prepared: Future, taken_ns: int) -> None:
        """On the worker thread, once the copy is done: the write goes to the writer thread."""
        try:
            self._executor.submit(self._write, prepared, taken_ns)
        except RuntimeError:  # closed while preparing: nothing written, nothing lost
            with self._lock:
                self._in_flight = False

    def _write(self, prepared: Future, taken_ns: int) -> SnapshotInfo | None:
        try:
            info = self.series.write(prepared.result(), taken_ns)
        except WorkerStopped:  # the node stopped before the copy: not a failure, nothing to write
            with self._lock:
                self._in_flight = False
                self._skipped += 1
            return None
        except Exception as exc:  # noqa: BLE001 - every failure is counted and reported, the node keeps running
            with self._lock:
                self._failed += 1
                self._failed_after_good = True
                self._last_error = f"{type(exc).__name__}: {exc}"
                self._in_flight = False
            self._log("error", f"periodic snapshot failed, earlier snapshots kept: {self._last_error}")
            return None
        with self._lock:
            self._written += 1
            self._last_good_ns, self._last_path = taken_ns, str(info.path)
            self._failed_after_good = False
            self._in_flight = False
        self._log("debug", f"snapshot {info.path.name}: {info.blocks} blocks, wrote {info.written_bytes} bytes, "
                           f"shared {info.linked_segments} segments")
        return info

    def status(self, now_ns: int) -> SnapshotStatus:
        with self._lock:
            reference = self._last_good_ns or self._since_ns
            stale = now_ns - reference > STALE_PERIODS * self.period_ns
            reasons = []
            if self._failed_after_good:
                reasons.append(f"the last snapshot write failed: {self._last_error}")
            if stale:
                age = (now_ns - reference) / 1e9
                what = "the last good snapshot" if self._last_good_ns else "no good snapshot yet; started"
                reasons.append(f"{what} {age:.0f} s ago (more than {STALE_PERIODS} periods)")
            return SnapshotStatus(not reasons, "; ".join(reasons) or "periodic snapshots up to date",
                                  self._last_good_ns, self._last_path, self._written, self._failed, self._skipped,
                                  self._last_error)

    def close(self, wait: bool = True) -> None:
        """Stop taking snapshots; with ``wait``, finish the one being written first."""
        self._executor.shutdown(wait=wait, cancel_futures=not wait)
