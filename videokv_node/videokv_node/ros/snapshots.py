"""The node's snapshot steps: restore on start, save on shutdown, park while inactive, periodic snapshots.

A thin caller of the memory's own snapshot code: ``save`` and ``load`` below are the only
places the node writes or reads a snapshot (the services in ``ros/memory_services.py``
use them too); the file format, its checks and the periodic series live in ``memory/``
and ``runtime/periodic_snapshots.py``. Refusals are logged with their reason and never
stop the node: a memory not restored starts empty.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from videokv_node.memory.engine import VideoMemoryEngine
from videokv_node.memory.snapshot.format import SnapshotError, SnapshotInfo, load_snapshot, resolve_snapshot_path, save_snapshot
from videokv_node.memory.snapshot.series import LATEST, SnapshotSeries
from videokv_node.ros.node_host import NodeHost
from videokv_node.runtime.periodic_snapshots import PeriodicSnapshotter


def save(engine: VideoMemoryEngine, target: Path) -> SnapshotInfo:
    """Write the engine's memory to the snapshot directory ``target`` (the caller holds the model thread)."""
    return save_snapshot(engine, target)


def load(engine: VideoMemoryEngine, target: Path) -> SnapshotInfo:
    """Replace the engine's memory with the snapshot at ``target``; a refused one (SnapshotError) changes nothing."""
    return load_snapshot(engine, target)


def restore_on_start(engine: VideoMemoryEngine, mem, series: SnapshotSeries | None, log) -> None:
    """Load ``memory.restore_on_start`` if it exists; a missing or refused snapshot starts empty, logged.

    ``latest``: the newest periodic snapshot that passes every check, older ones after a
    refusal (each refusal logged with its reason), else an empty memory. A snapshot restored
    less a damaged or missing segment logs that segment by name, why, and its blocks and frames.
    """
    if not mem.restore_on_start:
        return
    if mem.restore_on_start == LATEST:
        assert series is not None  # MemoryConfig: restore_on_start needs snapshot_dir, which makes the series
        info, refusals = series.restore_latest(engine)
        for r in refusals:
            log.error(f"periodic snapshot {r.path.name} refused: {r.reason}")
        if info is None:
            found = "none of the periodic snapshots passed its checks" if refusals else "no periodic snapshot yet"
            log.info(f"{found} in {series.root}: starting with an empty memory")
        else:
            restored(info, log)
        return
    try:
        target = resolve_snapshot_path(mem.snapshot_dir, name=mem.restore_on_start)
        if not target.exists():
            leftovers = sorted(p.name for p in target.parent.glob(f".{target.name}.*"))
            if leftovers:  # a save was interrupted between its two renames: a complete copy is there
                log.error(f"snapshot {target} is missing but an interrupted save left {leftovers}: "
                          f"rename the complete one to {target.name} to restore it; starting with an empty memory")
            else:
                log.info(f"no snapshot {target} yet: starting with an empty memory")
            return
        info = load(engine, target)
    except (SnapshotError, OSError) as exc:
        log.error(f"snapshot {mem.restore_on_start!r} not restored, starting with an empty memory: {exc}")
        return
    restored(info, log)


def restored(info: SnapshotInfo, log) -> None:
    """Log a restore: what came back, and, when segments were lost, each by name with its reason (an error)."""
    lost = f", less {info.lost_blocks} blocks of lost segments" if info.degraded else ""
    log.info(f"memory restored from {info.path}: {info.blocks} blocks{lost}, {info.frames_ingested} frames ingested")
    if info.degraded:
        log.error(f"snapshot {info.path.name} restored without its damaged segments: {info.loss()}")


def save_on_shutdown(engine: VideoMemoryEngine, mem, log) -> None:
    """Write ``memory.snapshot_on_shutdown`` if set (nothing else may touch the engine meanwhile); a failure is logged."""
    if not mem.snapshot_on_shutdown:
        return
    try:
        info = save(engine, resolve_snapshot_path(mem.snapshot_dir, name=mem.snapshot_on_shutdown))
        log.info(f"memory saved to {info.path} on shutdown ({info.blocks} blocks)")
    except (SnapshotError, OSError) as exc:
        log.error(f"memory not saved on shutdown: {exc}")


def park(engine: VideoMemoryEngine) -> tuple[Path, SnapshotInfo]:
    """Save the memory to a private temporary directory and close the engine (its device memory goes).

    Returns (the parked snapshot, what was saved); on any failure the directory is removed and
    the engine stays open.
    """
    parked = Path(tempfile.mkdtemp(prefix="videokv-parked-")) / "memory"
    try:
        info = save(engine, parked)
    except BaseException:
        discard(parked)
        raise
    engine.close()
    return parked, info


def unpark(adapter, settings, parked: Path) -> tuple[VideoMemoryEngine, SnapshotInfo]:
    """A new engine from the current settings with the parked memory loaded into it; the parking removed.

    A parked memory that cannot be restored raises (SnapshotError, or ConfigError for a
    budget set while inactive that does not hold) and stays parked.
    """
    engine = VideoMemoryEngine(adapter, settings.memory, settings.generation)
    try:
        info = load(engine, parked)
    except BaseException:
        engine.close()
        raise
    discard(parked)
    return engine, info


def discard(parked: Path) -> None:
    """Remove a parked memory (its private temporary directory)."""
    shutil.rmtree(parked.parent, ignore_errors=True)


def start_periodic(node: NodeHost, series: SnapshotSeries, period_s: float, callback_group) -> PeriodicSnapshotter:
    """``memory.snapshot_period_s``: a snapshotter and the node's timer that ticks it (node clock; each snapshot
    written off the model thread). The timer is the node's to destroy (``node.keep``); the snapshotter's
    ``close`` is the caller's, after the model worker has stopped."""
    def log_at(level: str, text: str) -> None:
        """The snapshotter's log lines (from its threads), throttled where they can repeat."""
        log = node.get_logger()  # after a shutdown, a console-only logger (the node's get_logger)
        if level == "debug":
            log.debug(text)
        elif level == "info":
            log.info(text)
        elif level == "warn":
            log.warn(text, throttle_duration_sec=node.WARN_THROTTLE_S)
        else:
            log.error(text)

    snapshotter = PeriodicSnapshotter(series, period_s, node.get_clock().now().nanoseconds, log=log_at)

    def tick() -> None:
        """Start the next periodic snapshot, unless this fired just before a deactivation."""
        worker, engine = node.worker, node.engine
        if node.snapshotter is None or worker is None or engine is None:
            return
        snapshotter.tick(node.get_clock().now().nanoseconds, worker, engine)

    node.keep(node.destroy_timer, node.create_timer(period_s, tick, callback_group=callback_group))
    node.get_logger().info(f"periodic snapshots every {period_s} s into {series.root}, newest {series.keep} kept")
    return snapshotter
