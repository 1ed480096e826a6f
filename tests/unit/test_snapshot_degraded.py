"""A damaged or missing segment costs its own blocks, not the snapshot (issue 33, part 4).

Periodic snapshots share segment files by hard links, so one damaged file is damaged in
every kept snapshot. The reference is the engine the snapshots were taken from: the restored
memory holds exactly its blocks less those the bad segment stored, bit for bit, the policy's
state less its references to them, and it goes on (ingest, answer, the next snapshot) as a
memory that never had them. Which blocks a segment holds is read from the files themselves.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.unit.test_snapshot import POLICY_CONFIGS, answers, engine, feed, memory_of, scene
from tests.unit.test_snapshot_incremental import manifest, segment_blocks
from videokv_node.memory.snapshot.format import SnapshotError, load_snapshot, save_snapshot
from videokv_node.memory.snapshot.series import SnapshotSeries

SIZES = dict(budget_frames=12, offload_frames=8)  # HERMES compresses less, so its segments are shared too


def three_snapshots(adapter, root: Path, policy: str):
    """An engine fed 15 frames, a periodic snapshot after every 5 (each linking what it can)."""
    series = SnapshotSeries(root, keep=3)
    a = engine(adapter, policy, **SIZES)
    frames = scene(20)
    for i in range(3):
        feed(a, frames[i * 5 : (i + 1) * 5])
        series.write(series.prepare(a), stamp_ns=(i + 1) * 10**9)
    return a, series, frames


def shared_segment(series: SnapshotSeries) -> str:
    """A segment of the newest snapshot that an older one links too (one inode, several names)."""
    newest, *older = series.snapshots()
    for name in segment_blocks(newest):
        if any((p / name).exists() and os.stat(p / name).st_ino == os.stat(newest / name).st_ino for p in older):
            return name
    pytest.fail(f"no segment of {newest.name} is shared with an older snapshot")


def own_segment(series: SnapshotSeries) -> str:
    """The segment the newest snapshot wrote (no older snapshot has it)."""
    newest, *older = series.snapshots()
    (name,) = [s for s in segment_blocks(newest) if not any((p / s).exists() for p in older)]
    return name


def damage(path: Path, how: str) -> None:
    if how == "corrupt":  # one flipped byte in the K/V: only the checksum sees it
        data = bytearray(path.read_bytes())
        data[-5] ^= 0xFF
        path.write_bytes(bytes(data))  # in place: every hard link sees it, as on a bad disk block
    else:
        path.unlink()


def expected(a, lost: set[int]) -> dict:
    """What a restore without the blocks ``lost`` must hold: the source engine's memory less them."""
    want = memory_of(a)
    want["blocks"] = [b for b in want["blocks"] if b[0] not in lost]
    want["policy"] = json.dumps(a.policy.without_blocks(a.policy.state_dict(), lost)["meta"], sort_keys=True)
    return want


def comparable(m: dict) -> dict:
    """memory_of without what depends on which blocks are held (stats, resident/offloaded entries;
    the counters that do not are compared on their own)."""
    return {k: v for k, v in m.items() if k not in ("stats", "counters")}


@pytest.mark.parametrize("policy", sorted(POLICY_CONFIGS))
@pytest.mark.parametrize("which, how", [("shared", "corrupt"), ("own", "missing")])
def test_a_bad_segment_costs_its_blocks_and_every_good_segment_is_restored(tiny_adapter, tmp_path, policy, which, how):
    a, series, frames = three_snapshots(tiny_adapter, tmp_path, policy)
    newest = series.snapshots()[0]
    bad = shared_segment(series) if which == "shared" else own_segment(series)
    lost = set(segment_blocks(newest)[bad]) & {e["id"] for e in manifest(newest)["blocks"]}
    assert lost and len(lost) < len(a.store), "the damage must cost some blocks, not all"
    damage(newest / bad, how)

    b = engine(tiny_adapter, policy, **SIZES)
    info, refusals = SnapshotSeries(tmp_path, keep=3).restore_latest(b)
    # The newest snapshot is restored (no refusal), the bad segment named with its reason and counted.
    assert refusals == [] and info.path == newest
    assert [name for name, _ in info.lost_segments] == [bad] and info.degraded
    assert ("is corrupt" if how == "corrupt" else "is missing") in info.lost_segments[0][1]
    assert info.lost_blocks == len(lost) and bad in info.loss() and f"{len(lost)} blocks" in info.loss()
    assert comparable(memory_of(b)) == comparable(expected(a, lost))
    # Ids, frames ingested and eviction counts as saved: the lost blocks are not evictions.
    assert memory_of(b)["counters"][:4] == memory_of(a)["counters"][:4]
    # The frames counted lost are those no restored block covers any more.
    held = {(b_.camera, s) for b_ in b.store.blocks() if b_.kind != "summary" for s in b_.stamps_ns}
    gone = {(b_.camera, s) for b_ in a.store.blocks() if b_.block_id in lost and b_.kind != "summary" for s in b_.stamps_ns}
    assert info.lost_frames == len(gone - held)
    for block in b.store.blocks():  # every restored block's K/V bit for bit
        mine = next(x for x in a.store.blocks() if x.block_id == block.block_id)
        for layer, kv in enumerate(block.layers):
            if kv is not None:
                for s, t in zip(a.store.layer_kv(mine, layer), b.store.layer_kv(block, layer)):
                    assert s.dtype == t.dtype and s.equal(t)
    # It goes on: answers, ingests, and its next periodic snapshot links nothing of the bad file.
    assert all(text is not None for text, *_ in answers(b))
    feed(b, frames[15:])
    again = SnapshotSeries(tmp_path, keep=3)
    again._base = newest  # as restore_latest left it in the node
    written = again.write(again.prepare(b), stamp_ns=9 * 10**9)
    assert bad not in segment_blocks(written.path)
    c = engine(tiny_adapter, policy, **SIZES)
    clean = load_snapshot(c, written.path)
    assert not clean.degraded and memory_of(c) == memory_of(b)


def test_a_lost_hermes_summary_token_goes_with_its_fold_counts_and_a_new_one_starts(tiny_adapter, tmp_path):
    """HERMES rewrites its summary token into the newest segment (a new revision): losing that segment
    loses the token; no restored state refers to it, and the next fold makes a new one."""
    a, series, frames = three_snapshots(tiny_adapter, tmp_path, "hermes")
    newest = series.snapshots()[0]
    summary = a.policy.summary
    bad = next(s for s, ids in segment_blocks(newest).items() if summary.block_id in ids)
    damage(newest / bad, "corrupt")
    b = engine(tiny_adapter, "hermes", **SIZES)
    info, _ = SnapshotSeries(tmp_path, keep=3).restore_latest(b)
    assert info.degraded and b.policy.summary is None and not any(b.policy._summary_count)
    assert all(x.kind != "summary" for x in b.store.blocks())
    feed(b, frames[15:])
    assert b.policy.summary is not None and b.policy.summary in b.store
    assert b.policy.summary.block_id >= a.next_block_id  # a new block, never the lost one's id again


def test_a_named_snapshot_degrades_too_and_the_state_file_still_refuses(tiny_adapter, tmp_path):
    """load_snapshot (~/load_memory) takes the same path; what is not shared (the state file) still refuses."""
    a = engine(tiny_adapter, "rekv", **SIZES)
    feed(a, scene(6))
    save_snapshot(a, tmp_path / "s1")
    feed(a, scene(4, seed=2))
    save_snapshot(a, tmp_path / "s2", base=tmp_path / "s1")
    (first,) = segment_blocks(tmp_path / "s1")
    damage(tmp_path / "s2" / first, "missing")
    b = engine(tiny_adapter, "rekv", **SIZES)
    info = load_snapshot(b, tmp_path / "s2")
    assert info.lost_segments[0][0] == first and info.blocks == len(b.store) < len(a.store)
    state = tmp_path / "s2" / "state.safetensors"
    state.write_bytes(state.read_bytes()[:-8])
    c = engine(tiny_adapter, "rekv", **SIZES)
    with pytest.raises(SnapshotError, match="state.safetensors is corrupt"):
        load_snapshot(c, tmp_path / "s2")
    assert len(c.store) == 0
