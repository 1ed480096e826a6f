"""Periodic snapshots: a crash (SIGKILL, power loss, the OOM killer) loses at most one period.

A series lives in one directory (``memory.snapshot_dir``) as snapshots named

    auto-<sequence>-<UTC time the snapshot was taken>Z        e.g. auto-000042-20261125T101500.250000000Z

The sequence orders them (newest = largest), whatever the clock did (a bag replayed in a
loop, sim time starting at 0); the time says when, by the clock the caller passes (the node's,
so it follows ``use_sim_time``). Each snapshot after the first is written against the previous
one as its base (``snapshot.prepare_snapshot``): only blocks new since then are written, the
rest hard-linked, so a periodic snapshot costs the frames of one period, not the whole memory.
After each successful write the series keeps the newest ``keep`` and deletes the rest; since
shared segments are hard links, the disk holds each stored block once, however many of the
kept snapshots name it.

``restore_latest`` loads the newest snapshot that passes every check of ``load_snapshot``,
falling back to older ones, and reports each refusal with its reason. What sharing costs: a
segment file damaged on disk is damaged in every snapshot that links it. So a damaged or
missing segment does not refuse a snapshot: it costs that segment's blocks (named and
counted in the returned info), and every good segment is restored. An older snapshot would
seldom do better: it links the same damaged file, or, for the newest snapshot's own segment,
held at most the blocks a compaction copied into it, never the newest period's. Only a snapshot's own manifest or state file, never shared, sends
the restore back to an older snapshot.
"""

from __future__ import annotations

import re
import shutil
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from videokv_node.memory.snapshot.files import SnapshotError
from videokv_node.memory.snapshot.format import PreparedSnapshot, SnapshotInfo, Snapshottable, load_snapshot, prepare_snapshot

PREFIX = "auto"
LATEST = "latest"  # memory.restore_on_start value: the newest good snapshot of the series
_NAME = re.compile(rf"{PREFIX}-(\d{{6,}})-(\d{{8}}T\d{{6}}\.\d{{9}})Z")
_TMP = re.compile(rf"\.{PREFIX}-\d{{6,}}-.*\.(tmp|old)-[0-9a-f]{{8}}")


def snapshot_name(sequence: int, stamp_ns: int) -> str:
    """``auto-<sequence>-<UTC time of stamp_ns to the nanosecond>Z``."""
    seconds, ns = divmod(int(stamp_ns), 1_000_000_000)
    when = datetime.fromtimestamp(seconds, tz=timezone.utc).strftime("%Y%m%dT%H%M%S")
    return f"{PREFIX}-{sequence:06d}-{when}.{ns:09d}Z"


@dataclass(frozen=True, slots=True)
class Refusal:
    path: Path
    reason: str


class SnapshotSeries:
    """The periodic snapshots in ``root``; one writer at a time (the node's snapshot thread).

    ``prepare`` runs on the thread that owns the engine (it copies what is new); ``write`` on
    any thread (serialising, hashing, linking, renaming, pruning). The base of the next
    snapshot is the last one this series wrote or restored, never a snapshot it has not
    checked.
    """

    def __init__(self, root: str | Path, keep: int) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root = Path(root).expanduser()
        self.keep = keep
        self._base: Path | None = None
        self._lock = threading.Lock()

    def snapshots(self) -> list[Path]:
        """The series' snapshot directories, newest (largest sequence) first."""
        if not self.root.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.root.iterdir() if (m := _NAME.fullmatch(p.name)) and p.is_dir()]
        return [p for _, p in sorted(found, reverse=True)]

    def prepare(self, engine: Snapshottable) -> PreparedSnapshot:
        """Copy what the next snapshot writes out of the engine (on the engine's thread)."""
        with self._lock:
            base = self._base if self._base is not None and self._base.is_dir() else None
        return prepare_snapshot(engine, base)

    def write(self, prepared: PreparedSnapshot, stamp_ns: int) -> SnapshotInfo:
        """Write ``prepared`` as the next snapshot of the series, then keep only the newest ``keep``.

        On failure (disk full, directory gone or read-only, base segment deleted) the error is
        raised, nothing half-written is left, earlier snapshots are intact, and the next
        snapshot is written whole (no base).
        """
        self.root.mkdir(parents=True, exist_ok=True)
        existing = self.snapshots()
        sequence = 1 + (_sequence(existing[0].name) if existing else 0)
        target = self.root / snapshot_name(sequence, stamp_ns)
        try:
            info = prepared.write(target)
        except BaseException:
            with self._lock:
                self._base = None
            raise
        with self._lock:
            self._base = target
        self.prune()
        return info

    def prune(self) -> list[Path]:
        """Delete all but the newest ``keep`` snapshots and leftovers of interrupted writes; the deleted."""
        gone = self.snapshots()[self.keep :]
        gone += [p for p in self.root.iterdir() if _TMP.fullmatch(p.name) and p.is_dir() and not p.is_symlink()]
        for p in gone:
            shutil.rmtree(p, ignore_errors=True)
        return gone

    def restore_latest(self, engine: Snapshottable) -> tuple[SnapshotInfo | None, list[Refusal]]:
        """Load the newest snapshot that passes every check; (its info or None, the refusals, newest first).

        A refused snapshot leaves the engine as it was (``load_snapshot``), so after the last
        refusal the memory is still the empty one it started with. A snapshot restored less a
        lost segment is not a refusal: its info says what was lost (``SnapshotInfo.loss``).
        """
        refusals = []
        for path in self.snapshots():
            try:
                info = load_snapshot(engine, path)
            except (SnapshotError, OSError) as exc:
                refusals.append(Refusal(path, str(exc)))
                continue
            with self._lock:
                self._base = path
            return info, refusals
        return None, refusals


def _sequence(name: str) -> int:
    """The sequence number in a snapshot directory's name (``snapshots()`` lists only names that match)."""
    match = _NAME.fullmatch(name)
    if match is None:
        raise ValueError(f"{name} is not a snapshot directory's name")
    return int(match.group(1))
