"""PeriodicSnapshotter on an injected clock: staleness, failed writes, pruning, skipped ticks (no ROS).

Times are plain nanoseconds passed to ``tick`` and ``status`` (the node passes its clock's), so
the three-period staleness boundary is checked exactly, with no wall time. The model worker is
a stand-in that runs the copy inline; the write still runs on the snapshotter's own thread, and
the tests wait for it on its counters. What was written is read back from the directory.
"""

from __future__ import annotations

import errno
import time
from concurrent.futures import Future

import pytest

from tests.unit.test_snapshot import engine, feed, memory_of, scene
from videokv_node.memory.snapshot import format as snapshot_mod
from videokv_node.memory.snapshot.format import load_snapshot
from videokv_node.memory.snapshot.series import SnapshotSeries, snapshot_name
from videokv_node.runtime.periodic_snapshots import STALE_PERIODS, PeriodicSnapshotter
from videokv_node.runtime.worker import WorkerBusy

S = 1_000_000_000
PERIOD = 2 * S
T0 = 50 * S  # node clock at start (sim time, say)


class InlineWorker:
    """``ModelWorker.call`` run at once on the caller's thread (the copy; the write stays on the writer thread)."""

    def call(self, fn) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn())
        except Exception as exc:  # noqa: BLE001 - handed over as the real worker does
            future.set_exception(exc)
        return future


class BusyWorker:
    def call(self, fn) -> Future:
        raise WorkerBusy("the model's request queue is full")


def settled(snap: PeriodicSnapshotter, written: int = 0, failed: int = 0, timeout: float = 60.0):
    """The status once the writer thread has finished ``written`` good and ``failed`` failed writes."""
    deadline = time.monotonic() + timeout
    while True:
        s = snap.status(0)
        if s.written >= written and s.failed >= failed:
            assert (s.written, s.failed) == (written, failed), s
            return s
        assert time.monotonic() < deadline, f"writer never reached {written} written, {failed} failed: {s}"
        time.sleep(0.01)


@pytest.fixture
def setup(tiny_adapter, tmp_path):
    logs: list[tuple[str, str]] = []
    series = SnapshotSeries(tmp_path / "snaps", keep=2)
    snap = PeriodicSnapshotter(series, PERIOD / S, started_ns=T0, log=lambda level, text: logs.append((level, text)))
    e = engine(tiny_adapter, "rekv", budget_frames=6, offload_frames=8)
    yield snap, series, e, logs
    snap.close()


def diagnostic_level(status):
    """The /diagnostics level the node publishes for ``status`` (ros/diagnostics.py), where ROS is installed."""
    diagnostics = pytest.importorskip("videokv_node.ros.diagnostics", reason="diagnostic_msgs (ROS 2) is not installed")
    return diagnostics.snapshot_status(status).level


def test_no_snapshot_for_three_periods_after_start_warns(setup):
    snap, _, _, _ = setup
    limit = T0 + STALE_PERIODS * PERIOD
    assert STALE_PERIODS == 3
    ok = snap.status(limit)  # exactly three periods: still fine
    assert ok.ok and ok.message == "periodic snapshots up to date" and ok.last_good_ns == 0
    stale = snap.status(limit + 1)
    assert not stale.ok and "no good snapshot yet; started 6 s ago (more than 3 periods)" in stale.message
    assert diagnostic_level(ok).name == "OK" and diagnostic_level(stale).name == "WARN"


def test_the_last_good_snapshot_older_than_three_periods_warns(setup):
    snap, series, e, _ = setup
    feed(e, scene(3))
    taken = T0 + 10 * S
    assert snap.tick(taken, InlineWorker(), e)
    s = settled(snap, written=1)
    assert s.ok and s.last_good_ns == taken and s.last_path == str(series.root / snapshot_name(1, taken))
    assert snap.status(taken + STALE_PERIODS * PERIOD).ok  # staleness counts from the snapshot, not from start
    stale = snap.status(taken + STALE_PERIODS * PERIOD + 1)
    assert not stale.ok and "the last good snapshot 6 s ago (more than 3 periods)" in stale.message
    assert diagnostic_level(stale).name == "WARN"
    assert snap.tick(taken + 7 * S, InlineWorker(), e)  # a new one: fresh again
    assert settled(snap, written=2).last_good_ns == taken + 7 * S
    assert snap.status(taken + STALE_PERIODS * PERIOD + 1).ok


def test_a_failed_write_is_counted_and_warns_and_earlier_snapshots_stay_intact(setup, monkeypatch):
    snap, series, e, logs = setup
    feed(e, scene(4))
    assert snap.tick(T0 + 1 * S, InlineWorker(), e)
    first = settled(snap, written=1)
    kept = {p.name: p.read_bytes() for p in (series.root / snapshot_name(1, T0 + 1 * S)).iterdir()}
    saved = memory_of(e)
    feed(e, scene(2, seed=3))

    real_save = snapshot_mod.save_file

    def full_disk(tensors, path, metadata=None):
        real_save(tensors, path, metadata=metadata)  # the file is there, then the disk is full
        with open(path, "r+b") as f:
            f.truncate(7)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(snapshot_mod, "save_file", full_disk)
    assert snap.tick(T0 + 2 * S, InlineWorker(), e)
    failed = settled(snap, written=1, failed=1)
    monkeypatch.undo()
    assert not failed.ok and failed.message.startswith("the last snapshot write failed: OSError: [Errno 28] No space left")
    assert failed.last_error.startswith("OSError") and failed.last_good_ns == first.last_good_ns  # the last good one still
    assert diagnostic_level(failed).name == "WARN"
    assert ("error", f"periodic snapshot failed, earlier snapshots kept: {failed.last_error}") in logs
    # Earlier snapshot: same files, same bytes, loads to what it held; nothing half-written left.
    assert [p.name for p in series.snapshots()] == [snapshot_name(1, T0 + 1 * S)]
    assert {p.name: p.read_bytes() for p in series.snapshots()[0].iterdir()} == kept
    assert [p.name for p in series.root.iterdir()] == [snapshot_name(1, T0 + 1 * S)]
    restored = engine(e.adapter, "rekv", budget_frames=6, offload_frames=8)
    load_snapshot(restored, series.snapshots()[0])
    assert memory_of(restored) == saved
    # The next good write clears the WARN (the failure stays counted).
    assert snap.tick(T0 + 3 * S, InlineWorker(), e)
    again = settled(snap, written=2, failed=1)
    assert again.ok and again.failed == 1 and again.last_good_ns == T0 + 3 * S


def test_the_newest_keep_snapshots_are_kept_and_the_newest_restores(setup):
    snap, series, e, _ = setup
    frames = scene(12)
    for i in range(4):
        feed(e, frames[i * 3 : (i + 1) * 3])
        assert snap.tick(T0 + (i + 1) * PERIOD, InlineWorker(), e)
        settled(snap, written=i + 1)
    names = sorted(p.name for p in series.root.iterdir())
    assert names == [snapshot_name(3, T0 + 3 * PERIOD), snapshot_name(4, T0 + 4 * PERIOD)]  # keep: 2
    restored = engine(e.adapter, "rekv", budget_frames=6, offload_frames=8)
    info, refusals = series.restore_latest(restored)
    assert refusals == [] and info.path.name == names[-1] and memory_of(restored) == memory_of(e)


def test_a_busy_model_skips_the_tick_without_failing(setup):
    snap, series, e, logs = setup
    assert not snap.tick(T0 + S, BusyWorker(), e)
    s = snap.status(T0 + S)
    assert s.ok and (s.written, s.failed, s.skipped) == (0, 0, 1) and not series.root.exists()
    assert logs == [("warn", "periodic snapshot skipped: the model's request queue is full")]
    assert snap.tick(T0 + 2 * S, InlineWorker(), e)  # the next tick is not blocked by the skipped one
    assert settled(snap, written=1).skipped == 1
