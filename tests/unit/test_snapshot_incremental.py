"""Incremental and periodic snapshots: only what is new is written, and what is shared survives deletion.

The reference for what a snapshot must hold is, as in test_snapshot.py, the engine it was
taken from (bit-identical blocks, identical answers). What was written is read back from the
files themselves (segment listings, inode numbers), not from the writer's own bookkeeping.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open

from tests.unit.test_snapshot import POLICY_CONFIGS, answers, assert_same_kv, engine, feed, memory_of, scene
from videokv_node.memory.snapshot import format as snapshot_mod
from videokv_node.memory.snapshot.format import SNAPSHOT_VERSION, load_snapshot, save_snapshot
from videokv_node.memory.snapshot.series import SnapshotSeries, snapshot_name

DATA = Path(__file__).resolve().parents[1] / "data"


def segment_blocks(path: Path) -> dict[str, list[int]]:
    """Segment file name -> the block ids it stores, read from the files."""
    out = {}
    for seg in sorted(path.glob("seg-*.safetensors")):
        with safe_open(seg, "pt") as f:
            out[seg.name] = [int(b[0]) for b in json.loads(f.metadata()["blocks"])]
    return out


def manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


@pytest.mark.parametrize("policy", sorted(POLICY_CONFIGS))
def test_an_incremental_snapshot_writes_only_new_blocks_and_restores_exactly(tiny_adapter, tmp_path, policy):
    frames = scene(16)
    a = engine(tiny_adapter, policy, budget_frames=6, offload_frames=8)
    feed(a, frames[:10])
    first = save_snapshot(a, tmp_path / "s1")
    in_first = {b["id"] for b in manifest(tmp_path / "s1")["blocks"]}
    feed(a, frames[10:12])
    second = save_snapshot(a, tmp_path / "s2", base=tmp_path / "s1")
    now = manifest(tmp_path / "s2")
    assert now["version"] == SNAPSHOT_VERSION == 4  # 3: version 2 plus poses (issue 17); 4: spans (issue 36)
    segs = segment_blocks(tmp_path / "s2")
    linked = [s for s in segs if (tmp_path / "s1" / s).exists()]
    new = [s for s in segs if s not in linked]
    assert linked, "the base still holds live blocks: its segment must be shared"
    assert second.linked_segments == len(linked) and second.written_bytes < first.written_bytes
    for s in linked:  # shared, not copied: one inode under two names
        assert os.stat(tmp_path / "s1" / s).st_ino == os.stat(tmp_path / "s2" / s).st_ino
    # The new segment holds the blocks the base did not have, and those whose K/V changed in place.
    changed = {b["id"] for b in now["blocks"] if b["id"] in in_first and b["revision"] > 0}
    wrote = {i for s in new for i in segs[s]}
    assert wrote == ({b["id"] for b in now["blocks"]} - in_first) | changed
    # Deleting the base breaks nothing: the second snapshot restores the engine exactly.
    shutil.rmtree(tmp_path / "s1")
    b = engine(tiny_adapter, policy, budget_frames=6, offload_frames=8)
    load_snapshot(b, tmp_path / "s2")
    assert memory_of(b) == memory_of(a)
    assert_same_kv(a, b)
    assert answers(b) == answers(a)


def test_hermes_summary_token_is_rewritten_when_it_changes(tiny_adapter, tmp_path):
    a = engine(tiny_adapter, "hermes", budget_frames=4)
    feed(a, scene(10))
    summary = a.policy.summary
    assert summary is not None and summary.revision > 0
    save_snapshot(a, tmp_path / "s1")
    seen = summary.revision
    feed(a, scene(6, seed=3))
    assert a.policy.summary is summary and summary.revision > seen  # folded more pruned tokens
    save_snapshot(a, tmp_path / "s2", base=tmp_path / "s1")
    entry = next(b for b in manifest(tmp_path / "s2")["blocks"] if b["id"] == summary.block_id)
    assert not (tmp_path / "s1" / entry["segment"]).exists()  # written again, not linked
    b = engine(tiny_adapter, "hermes", budget_frames=4)
    load_snapshot(b, tmp_path / "s2")
    assert_same_kv(a, b)


def test_a_base_segment_mostly_evicted_is_compacted_not_linked(tiny_adapter, tmp_path):
    a = engine(tiny_adapter, "full", budget_frames=6, offload_frames=0)
    feed(a, scene(8))
    save_snapshot(a, tmp_path / "s1")
    (old,) = segment_blocks(tmp_path / "s1")
    feed(a, scene(6, seed=4))  # most of the first segment's blocks are evicted now
    alive = [b.block_id for b in a.store.blocks() if b.block_id in segment_blocks(tmp_path / "s1")[old]]
    assert 0 < len(alive) < len(segment_blocks(tmp_path / "s1")[old]) / 2
    info = save_snapshot(a, tmp_path / "s2", base=tmp_path / "s1")
    assert info.linked_segments == 0 and old not in segment_blocks(tmp_path / "s2")
    assert set(alive) <= {i for ids in segment_blocks(tmp_path / "s2").values() for i in ids}
    b = engine(tiny_adapter, "full", budget_frames=6, offload_frames=0)
    load_snapshot(b, tmp_path / "s2")
    assert memory_of(b) == memory_of(a)


def test_a_base_of_another_model_is_ignored(tiny_adapter, tmp_path):
    from videokv_node.models.llava_onevision import LlavaOnevisionAdapter

    other = LlavaOnevisionAdapter.tiny(seed=1)
    o = engine(other, "rekv")
    feed(o, scene(4))
    save_snapshot(o, tmp_path / "theirs")
    a = engine(tiny_adapter, "rekv")
    feed(a, scene(4))
    info = save_snapshot(a, tmp_path / "mine", base=tmp_path / "theirs")
    assert info.linked_segments == 0
    b = engine(tiny_adapter, "rekv")
    load_snapshot(b, tmp_path / "mine")
    assert memory_of(b) == memory_of(a)


def test_a_version_1_snapshot_still_loads(tiny_adapter, tmp_path):
    """tests/data/snapshot-v1-tiny-hermes: written by the version-1 code (one kv.safetensors) from
    ``engine(tiny, 'hermes')`` fed ``scene(9)``; its blocks are read back as the manifest lists them."""
    v1 = DATA / "snapshot-v1-tiny-hermes"
    saved = manifest(v1)
    assert saved["version"] == 1
    b = engine(tiny_adapter, "hermes")
    info = load_snapshot(b, v1)
    assert info.frames_ingested == 9
    assert [(x.block_id, [None if kv is None else kv.n_tokens for kv in x.layers]) for x in b.store.blocks()] == [
        (e["id"], e["layer_tokens"]) for e in saved["blocks"]
    ]
    with safe_open(v1 / "kv.safetensors", "pt") as f:  # layer 0's keys, block after block, as stored
        keys0 = f.get_tensor("layers/0/keys")
    at = 0
    for x in b.store.blocks():
        if x.layers[0] is not None:
            n = x.layers[0].n_tokens
            assert (b.store.layer_kv(x, 0)[0].cpu() == keys0[:, at : at + n]).all()
            at += n
    assert at == keys0.shape[1]
    save_snapshot(b, tmp_path / "v2")  # and it is written back in the current version
    c = engine(tiny_adapter, "hermes")
    load_snapshot(c, tmp_path / "v2")
    assert memory_of(c) == memory_of(b)


# --- the periodic series -----------------------------------------------------------------
def test_names_say_when_and_sort_by_sequence():
    assert snapshot_name(42, 1_764_065_700_250_000_000) == "auto-000042-20251125T101500.250000000Z"
    assert snapshot_name(1, 0) == "auto-000001-19700101T000000.000000000Z"  # sim time at 0


def test_a_series_keeps_the_newest_and_shares_what_it_can(tiny_adapter, tmp_path):
    series = SnapshotSeries(tmp_path / "snaps", keep=2)
    a = engine(tiny_adapter, "rekv", budget_frames=6, offload_frames=8)
    frames = scene(15)
    written = []
    for i in range(3):
        feed(a, frames[i * 5 : (i + 1) * 5])
        info = series.write(series.prepare(a), stamp_ns=(100 - i) * 10**9)  # a clock going backwards: order by sequence
        written.append(info)
    names = [p.name for p in series.snapshots()]
    assert names == [written[2].path.name, written[1].path.name] and names[0].startswith("auto-000003-")
    assert written[1].linked_segments >= 1 and written[2].linked_segments >= 1
    # Disk: each stored block once, whatever the number of snapshots naming it.
    inodes = {os.stat(f).st_ino: f.stat().st_size for p in series.snapshots() for f in p.glob("seg-*")}
    assert sum(inodes.values()) < 2 * max(sum(f.stat().st_size for f in p.glob("seg-*")) for p in series.snapshots())
    b = engine(tiny_adapter, "rekv", budget_frames=6, offload_frames=8)
    info, refusals = SnapshotSeries(tmp_path / "snaps", keep=2).restore_latest(b)
    assert refusals == [] and info.path == written[2].path
    assert memory_of(b) == memory_of(a)


def test_restore_latest_falls_back_past_a_corrupt_snapshot(tiny_adapter, tmp_path):
    series = SnapshotSeries(tmp_path, keep=3)
    a = engine(tiny_adapter, "rekv", budget_frames=6, offload_frames=8)
    frames = scene(10)
    feed(a, frames[:5])
    series.write(series.prepare(a), stamp_ns=1)
    good = memory_of(a)
    feed(a, frames[5:])
    newest = series.write(series.prepare(a), stamp_ns=2).path
    state = newest / "state.safetensors"
    state.write_bytes(state.read_bytes()[:-8])  # a torn write the checksum sees
    b = engine(tiny_adapter, "rekv", budget_frames=6, offload_frames=8)
    info, refusals = series.restore_latest(b)
    assert [r.path for r in refusals] == [newest] and "state.safetensors is corrupt" in refusals[0].reason
    assert info.path.name.startswith("auto-000001-") and memory_of(b) == good
    # Nothing good at all: an empty memory, every refusal reported.
    shutil.rmtree(info.path)
    c = engine(tiny_adapter, "rekv", budget_frames=6, offload_frames=8)
    info, refusals = SnapshotSeries(tmp_path, keep=3).restore_latest(c)
    assert info is None and len(refusals) == 1 and len(c.store) == 0


def test_a_failed_write_keeps_what_was_written_and_the_next_is_whole(tiny_adapter, tmp_path, monkeypatch):
    root = tmp_path / "snaps"
    series = SnapshotSeries(root, keep=3)
    a = engine(tiny_adapter, "rekv", budget_frames=6, offload_frames=8)
    feed(a, scene(5))
    first = series.write(series.prepare(a), stamp_ns=1).path
    before = {p.name: p.stat().st_size for p in first.iterdir()}
    feed(a, scene(3, seed=2))
    prepared = series.prepare(a)

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(snapshot_mod, "save_file", full_disk)
    with pytest.raises(OSError, match="No space left"):
        series.write(prepared, stamp_ns=2)
    monkeypatch.undo()
    assert [p.name for p in series.snapshots()] == [first.name] and not [p for p in root.iterdir() if p.name.startswith('.')]
    assert {p.name: p.stat().st_size for p in first.iterdir()} == before
    info = series.write(series.prepare(a), stamp_ns=3)
    assert info.linked_segments == 0  # no base after a failure: written whole
    b = engine(tiny_adapter, "rekv", budget_frames=6, offload_frames=8)
    load_snapshot(b, info.path)
    assert memory_of(b) == memory_of(a)
