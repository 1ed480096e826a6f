"""Poses in memory: each frame's pose is kept with its block, cited with the evidence, leaves
with the block, and survives snapshots (version 2); a version 1 snapshot loads with no poses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.unit.helpers import scene as scene_frames
from videokv_node.memory import Frame, GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.memory.config import HermesConfig, MuKVConfig, StreamKVConfig
from videokv_node.memory.snapshot.format import SNAPSHOT_VERSION, SnapshotError, load_snapshot, save_snapshot
from videokv_node.pose import Pose, yaw_quaternion

POLICY_CONFIGS = {
    "full": {},
    "rekv": {},
    "streamkv": dict(streamkv=StreamKVConfig(similarity_threshold=0.9, min_segment_frames=2, max_segment_frames=3, retrieve_frames=3)),
    "hermes": dict(hermes=HermesConfig(chunk_frames=2, reindex_at=0.005)),
    "mukv": dict(mukv=MuKVConfig(retrieve_patch=3, retrieve_frame=2, retrieve_segment=1)),
}


def pose_of(stamp_ns: int) -> Pose:
    """A made-up trajectory: x grows 1 m per second, heading 0.1 rad per second."""
    t = stamp_ns / 1e9
    return Pose.make("odom", (t, 2.0 * t, 0.0), yaw_quaternion(0.1 * t))


def with_poses(frames: list[Frame], skip: set[int] = frozenset()) -> list[Frame]:
    """The frames, each with its pose except those at the indices in ``skip``."""
    return [Frame(f.camera, f.stamp_ns, f.rgb, None if i in skip else pose_of(f.stamp_ns)) for i, f in enumerate(frames)]


def engine(adapter, policy: str, budget_frames: int = 3, **over) -> VideoMemoryEngine:
    T, L = adapter.tokens_per_frame, adapter.geometry.n_layers
    sink = len(adapter.prefix_ids())
    page_bytes = 4 * adapter.geometry.bytes_per_token // L
    cfg = dict(policy=policy, budget_tokens=sink + (2 + budget_frames) * T, local_window_tokens=T,
               offload_bytes=3 * L * (T // 4) * page_bytes, page_tokens=4, retrieve_frames=2)
    cfg.update(POLICY_CONFIGS[policy])
    cfg.update(over)
    return VideoMemoryEngine(adapter, MemoryConfig(**cfg), GenerationConfig(max_new_tokens=2, max_new_tokens_limit=4))


def feed(e: VideoMemoryEngine, frames: list[Frame]) -> None:
    for f in frames:
        e.ingest([f])


def check_block_poses(e: VideoMemoryEngine, skip_stamps: set[int]) -> int:
    """Every block's poses are its frames' poses (None for frames sent without one); returns poses seen."""
    seen = 0
    for b in e.store.blocks():
        if b.kind == "summary" and b.stamp_ns <= 0:
            continue
        assert len(b.poses) == len(b.stamps_ns), (b.kind, b.stamps_ns, b.poses)
        for s, p in zip(b.stamps_ns, b.poses):
            assert p == (None if s in skip_stamps else pose_of(s)), (b.kind, s)
            seen += p is not None
    return seen


@pytest.mark.parametrize("policy", list(POLICY_CONFIGS))
def test_blocks_keep_their_frames_poses_and_evidence_cites_them(tiny_adapter, policy):
    frames = with_poses(scene_frames(9, 0, 3), skip={4})
    skip = {frames[4].stamp_ns}
    e = engine(tiny_adapter, policy)
    feed(e, frames)
    assert check_block_poses(e, skip) > 0
    answer = e.ask(Question("what is there?", max_new_tokens=1))
    assert answer.evidence
    for ev in answer.evidence:
        assert ev.pose == (None if ev.stamp_ns in skip else pose_of(ev.stamp_ns))
    # The pose table follows memory: only frames still cited (or pending) keep a pose there.
    live = {(b.camera, s) for b in e.store.blocks() for s in b.stamps_ns}
    live |= {(u.camera, s) for u in e.policy.pending_units() for s in (u.stamps_ns or (u.stamp_ns,))}
    assert set(e.tables.poses) <= live


def test_evicted_frames_take_their_poses_with_them(tiny_adapter):
    """full evicts (no offload): after 12 frames in a budget of a few, the oldest poses are gone."""
    e = engine(tiny_adapter, "full", budget_frames=2)
    frames = with_poses(scene_frames(12, 1, 3))
    feed(e, frames)
    kept = {s for b in e.store.blocks() for s in b.stamps_ns}
    assert e.store.evicted_blocks > 0 and frames[0].stamp_ns not in kept
    assert {s for _, s in e.tables.poses} == kept
    e.reset()
    assert e.tables.poses == {}


@pytest.mark.parametrize("policy", ["rekv", "streamkv", "mukv"])
def test_snapshot_round_trip_keeps_poses(tiny_adapter, tmp_path, policy):
    frames = with_poses(scene_frames(8, 2, 3), skip={1})
    skip = {frames[1].stamp_ns}
    a = engine(tiny_adapter, policy)
    feed(a, frames)
    save_snapshot(a, tmp_path / "snap")
    manifest = json.loads((tmp_path / "snap" / "manifest.json").read_text())
    assert manifest["version"] == SNAPSHOT_VERSION == 4
    b = engine(tiny_adapter, policy)
    load_snapshot(b, tmp_path / "snap")
    assert [x.poses for x in b.store.blocks()] == [x.poses for x in a.store.blocks()]
    assert check_block_poses(b, skip) > 0
    assert b.tables.poses == a.tables.poses  # pending frames' poses too (StreamKV's open segment)
    # Fed the same next frame, both make the same block, poses included.
    nxt = with_poses(scene_frames(9, 2, 3))[8:]
    feed(a, nxt)
    feed(b, nxt)
    assert [x.poses for x in b.store.blocks()] == [x.poses for x in a.store.blocks()]


def test_version_1_and_2_snapshots_load_with_no_poses(tiny_adapter, tmp_path):
    """Version 1 (tests/data, written by the version-1 code) and version 2 (a current snapshot with what
    version 3 added taken out) load, their blocks without poses."""
    v1 = Path(__file__).resolve().parents[1] / "data" / "snapshot-v1-tiny-hermes"
    old = engine(tiny_adapter, "hermes")
    load_snapshot(old, v1)
    assert len(old.store) > 0 and all(x.poses == () for x in old.store.blocks()) and old.tables.poses == {}

    a = engine(tiny_adapter, "rekv")
    feed(a, with_poses(scene_frames(5, 3, 3)))
    save_snapshot(a, tmp_path / "snap")
    path = tmp_path / "snap" / "manifest.json"
    m = json.loads(path.read_text())
    m["version"] = 2
    for entry in m["blocks"]:
        del entry["poses"]
    del m["engine"]["pending_poses"]
    path.write_text(json.dumps(m))
    b = engine(tiny_adapter, "rekv")
    load_snapshot(b, tmp_path / "snap")
    assert len(b.store) == len(a.store) and all(x.poses == () for x in b.store.blocks())
    assert all(ev.pose is None for ev in b.ask(Question("what is there?", max_new_tokens=1)).evidence)
    assert b.tables.poses == {}


def test_a_snapshot_with_a_bad_pose_is_refused_and_changes_nothing(tiny_adapter, tmp_path):
    a = engine(tiny_adapter, "rekv")
    feed(a, with_poses(scene_frames(4, 4, 3)))
    save_snapshot(a, tmp_path / "snap")
    path = tmp_path / "snap" / "manifest.json"
    m = json.loads(path.read_text())
    m["blocks"][0]["poses"][0]["position"][0] = math.nan
    path.write_text(json.dumps(m))
    b = engine(tiny_adapter, "rekv")
    feed(b, with_poses(scene_frames(2, 5, 3)))
    before = [(x.block_id, x.poses) for x in b.store.blocks()]
    with pytest.raises(SnapshotError, match="malformed.*non-finite"):
        load_snapshot(b, tmp_path / "snap")
    assert [(x.block_id, x.poses) for x in b.store.blocks()] == before



def test_mukv_segments_keep_the_poses_of_frames_waiting_in_its_partial_segment(tiny_adapter, tmp_path):
    """Segment blocks only: a frame waits in MuKV's own state (no block, not a pending unit) until its
    segment is full. Saved and restored meanwhile (the restore prunes the pose table), its pose must
    still reach the segment block."""
    mukv = MuKVConfig(granularities=("segment",), segment_frames=3, retrieve_patch=0, retrieve_frame=0, retrieve_segment=1)
    frames = with_poses(scene_frames(8, 6, 3))
    a = engine(tiny_adapter, "mukv", mukv=mukv)
    feed(a, frames[:7])  # two segments, frame 7 waiting
    save_snapshot(a, tmp_path / "snap")
    b = engine(tiny_adapter, "mukv", mukv=mukv)
    load_snapshot(b, tmp_path / "snap")
    feed(b, frames[7:])
    feed(b, with_poses(scene_frames(9, 6, 3))[8:])  # completes the third segment
    assert len(b.store) == 3
    assert check_block_poses(b, set()) == 9


def test_an_incremental_snapshot_keeps_the_poses_of_linked_and_new_blocks(tiny_adapter, tmp_path):
    """Poses live in the manifest, rewritten each time: blocks whose K/V come from the base's segment
    keep theirs as well as the new ones."""
    frames = with_poses(scene_frames(10, 7, 3), skip={6})
    a = engine(tiny_adapter, "rekv")
    feed(a, frames[:6])
    save_snapshot(a, tmp_path / "s1")
    feed(a, frames[6:])
    save_snapshot(a, tmp_path / "s2", base=tmp_path / "s1")
    b = engine(tiny_adapter, "rekv")
    load_snapshot(b, tmp_path / "s2")
    assert [x.poses for x in b.store.blocks()] == [x.poses for x in a.store.blocks()]
    assert check_block_poses(b, {frames[6].stamp_ns}) > 0
