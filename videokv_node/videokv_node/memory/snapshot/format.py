"""Memory that survives restarts: the engine's state dict in a snapshot directory.

The engine gives its state and takes it back (``state_dict`` / ``load_state_dict``,
``engine_state.py``); this module and its helpers only handle the files: the format below
(``pack.py`` packs a state into it, ``read.py`` reads and checks it back),
atomic writes, checksums and shared segments (``files.py``). They never import the
engine: what they ask of it is ``Snapshottable``. ``save_snapshot`` and ``load_snapshot`` are
the one way out and in (``prepare_snapshot`` + ``PreparedSnapshot.write`` is ``save_snapshot``
split in two, for periodic snapshots).

A snapshot (format version 4) is a directory of safetensors files and a manifest, never pickle:

    manifest.json       what the memory is: format version, model identity, policy, counters,
                        one entry per block (ids, camera, stamps, kind, stream, rank, tier, the
                        tokens each layer keeps now, its revision, the segment holding its K/V,
                        the robot's pose at each of its stamps), the poses of frames no block
                        cites yet,
                        the policy's state, and every file's size and sha256
    state.safetensors   what changes while a block lives: per layer the kept token indices and
                        their logical (RoPE) positions now, the blocks' representatives, the
                        policy's tensors
    seg-*.safetensors   what never changes once a block is stored: its encoding positions, mean
                        key and, per layer, the K/V of the tokens it kept when the segment was
                        written; the segment's block list is in the file's metadata

Segments are what makes a periodic snapshot cheap. A block's K/V never change in place:
compression keeps a subset of its tokens (``BlockStore.keep``), re-indexing moves logical
positions only (in the state file), and the one exception, HERMES' running summary token
(``BlockStore.replace_layer``), bumps the block's ``revision``. So a snapshot taken with a
previous one as ``base`` writes one new segment with only the blocks that are new (or of a new
revision) and hard-links the base's segments that still hold live blocks: earlier files are
shared, not copied, and deleting an old snapshot never breaks a newer one (a link is a name;
the bytes go when the last name does). A base segment whose live entries fell below
``COMPACT_BELOW`` of what it stores is not linked: its live blocks are written again into the
new segment, so a snapshot never needs more than about 1 / COMPACT_BELOW times its live K/V.
The state file and manifest are rewritten every time (indices and positions: 16 bytes a
kept token and layer, against the K/V's 2 x heads x head_dim x dtype bytes). Sharing means a
segment damaged on disk is damaged in every snapshot that links it, so a bad segment costs
its own blocks on load, not the snapshot (``load_snapshot``).

Tensors (B blocks; L layers; P position rows; H_kv heads of dimension D). Per layer, not per
block: a day of MuKV is thousands of blocks, and one tensor per block and layer would make a
file's header huge.

    seg: blocks/positions      (P, sum of its blocks' encoded tokens) int64
    seg: blocks/key_mean       (B_seg, L, H_kv, D) float32
    seg: layers/{l}/index      (S_l,) int64, the kept token indices stored, block after block
    seg: layers/{l}/keys       (H_kv, S_l, D) the model's dtype, rotated at the encoding positions
    seg: layers/{l}/values     (H_kv, S_l, D)
    state: layers/{l}/index    (N_l,) int64, kept now, in manifest block order (a subset of the stored)
    state: layers/{l}/logical  (P, N_l) int64
    state: blocks/rep          (R, ...) the representatives of the R blocks that have one
    state: policy/...          the policy's own tensors (``MemoryPolicy.state_dict``)

What is not saved: the prompt sink (recomputed from the model: the fingerprint and the sink's
token ids are checked instead), what policies derive from the config and the model (guidance
and pseudo queries), latency windows and debugging fields. Version 1 snapshots (one
``kv.safetensors``, no segments) still load.

Writing is atomic (``files``): everything goes into a sibling temporary directory,
files and directory fsynced, then renamed over the target. Crash windows (one writer per name):
before the rename the previous snapshot is intact and a ``.tmp-`` leftover is never read; while
an existing snapshot of the same name is replaced, both complete copies are there under
temporary names, and ``load_snapshot`` of the name says so.

Writing is split in two so that a periodic snapshot stalls the model for no longer than the
copy of what it writes: ``prepare_snapshot`` (on the thread that owns the engine) copies the
new blocks' K/V and the state to the host; ``PreparedSnapshot.write`` (any thread) serialises,
hashes, links and renames.
"""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from safetensors.torch import save_file

from videokv_node.memory.snapshot import pack
from videokv_node.memory.snapshot.files import MANIFEST, SnapshotError, disk_bytes, fsync, leftovers, new_temporary, resolve_snapshot_path, sha256, share_file, swap_in
from videokv_node.memory.snapshot.pack import COMPACT_BELOW, SNAPSHOT_VERSION, STATE
from videokv_node.memory.snapshot.read import check_compatible, read_manifest, read_state
from videokv_node.memory.records.state import PolicyStateError, dtype_from_name, dtype_name, reason

__all__ = [
    "COMPACT_BELOW", "SNAPSHOT_VERSION", "SnapshotError", "SnapshotInfo", "Snapshottable", "PreparedSnapshot",
    "prepare_snapshot", "save_snapshot", "load_snapshot", "read_manifest", "resolve_snapshot_path", "dtype_name",
    "dtype_from_name",
]


class Snapshottable(Protocol):
    """What a snapshot reads and writes: the engine (``VideoMemoryEngine``), seen from here."""

    def identity(self) -> dict:
        """``{"model": {...}, "policy": name}``: what a saved state must match to be loaded."""

    def state_dict(self, kv_for: Callable[[list[dict]], Collection[int]] | None = None) -> dict:
        """The whole memory (``EngineState.state_dict``); K/V only of the blocks ``kv_for`` names."""

    def load_state_dict(self, state: dict) -> None:
        """Replace the whole memory, or raise and change nothing."""

    def stats(self):
        """Its ``EngineStats`` (``frames_in_memory``, ``frames_ingested``)."""


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    path: Path  # the snapshot directory
    blocks: int  # blocks written; on load, blocks held once the current caps are enforced
    frames_ingested: int  # camera frames the memory had taken in when saved
    bytes: int  # size of the snapshot's files (shared segments counted in full)
    policy: str
    fingerprint: str  # the model's
    written_bytes: int = 0  # bytes this save wrote (new segment, state, manifest); 0 on load
    linked_segments: int = 0  # segments shared with the base instead of written
    lost_segments: tuple[tuple[str, str], ...] = ()  # on load: (segment file, why) of each segment not restored
    lost_blocks: int = 0  # on load: blocks those segments held, left out
    lost_frames: int = 0  # on load: camera frames only those blocks covered (gone from memory)

    @property
    def degraded(self) -> bool:
        """True when a load restored the memory less some lost segments' blocks."""
        return bool(self.lost_segments)

    def loss(self) -> str:
        """The lost segments, named with their reasons, and what they cost; '' when none."""
        if not self.lost_segments:
            return ""
        names = "; ".join(f"{name} ({why})" for name, why in self.lost_segments)
        return (f"{len(self.lost_segments)} segment(s) lost, {self.lost_blocks} blocks and {self.lost_frames} frames "
                f"not restored: {names}")


# --- save ---------------------------------------------------------------------------
@dataclass(slots=True)
class PreparedSnapshot:
    """A snapshot copied out of the engine, not yet on disk; ``write`` puts it there (any thread).

    Holds host copies only: the engine may go on ingesting while it is written.
    """

    manifest: dict  # without the files' checksums
    state: dict[str, torch.Tensor]
    segment_name: str | None  # the new segment, None when every block is in the base
    segment: dict[str, torch.Tensor]
    segment_meta: dict[str, str]
    linked: dict[str, dict]  # base segment name -> its manifest record, to be hard-linked from ``base``
    base: Path | None
    frames_ingested: int
    policy: str
    fingerprint: str
    new_blocks: int = 0  # blocks whose K/V go into the new segment
    info: SnapshotInfo | None = field(default=None)

    def write(self, target: Path) -> SnapshotInfo:
        """Write to the directory ``target``, atomically (module docstring).

        An existing ``target`` is replaced only if it is a snapshot directory. On any error
        nothing is left behind and a previous snapshot of the same name is intact. A base
        segment that has disappeared since ``prepare_snapshot`` raises SnapshotError (take the
        next snapshot without a base).
        """
        target = Path(target)
        if target.is_symlink() or (target.exists() and not (target / MANIFEST).is_file()):
            raise SnapshotError(f"{target} exists and is not a snapshot directory: not replaced")
        tmp = new_temporary(target)
        manifest = self.manifest
        try:
            segments = {}
            for name, record in self.linked.items():
                if self.base is None:  # prepare_snapshot links segments only from a base
                    raise SnapshotError(f"segment {name} is to be linked but the snapshot has no base")
                try:
                    share_file(self.base / name, tmp / name)
                except FileNotFoundError as exc:
                    raise SnapshotError(f"segment {name} of the base snapshot {self.base} is gone: {exc}") from exc
                segments[name] = record
            written = 0
            if self.segment_name is not None:
                seg = tmp / self.segment_name
                save_file(self.segment, str(seg), metadata=self.segment_meta)
                fsync(seg)
                segments[self.segment_name] = {"bytes": seg.stat().st_size, "sha256": sha256(seg),
                                               "entries": int(self.segment_meta["entries"])}
                written += seg.stat().st_size
            state = tmp / STATE
            save_file(self.state, str(state))
            fsync(state)
            manifest["segments"] = segments
            manifest["state"] = {"file": STATE, "bytes": state.stat().st_size, "sha256": sha256(state)}
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str))
            fsync(tmp / MANIFEST)
            fsync(tmp)
            written += state.stat().st_size + (tmp / MANIFEST).stat().st_size
            swap_in(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        for stale in leftovers(target):  # of crashed saves: the new snapshot is complete now
            shutil.rmtree(stale, ignore_errors=True)
        self.info = SnapshotInfo(target, len(manifest["blocks"]), self.frames_ingested, disk_bytes(target), self.policy,
                                 self.fingerprint, written_bytes=written, linked_segments=len(self.linked))
        return self.info


def save_snapshot(source: Snapshottable, target: Path, base: Path | None = None) -> SnapshotInfo:
    """Write ``source``'s whole memory to the directory ``target`` (``prepare_snapshot`` then ``write``).

    Call it from the thread that owns the engine. Peak host memory: about two copies of what
    it writes (gathered, then serialised).
    """
    return prepare_snapshot(source, base).write(Path(target))


def prepare_snapshot(source: Snapshottable, base: Path | None = None) -> PreparedSnapshot:
    """Copy what a snapshot must write out of ``source`` (call it on the thread that owns the engine).

    With ``base`` (an earlier version-2 or 3 snapshot of the same model), blocks stored there at
    their current revision are not copied: their segments will be linked. An unreadable or
    foreign base is ignored (everything is written).
    """
    identity = source.identity()
    model = identity["model"]
    base_blocks, base_segments = pack.base_index(model["fingerprint"], base)
    plan: dict = {}

    def kv_for(blocks: list[dict]) -> list[int]:
        """The blocks whose K/V go into the new segment: those the base's linked segments lack."""
        plan["reuse"], plan["linked"] = pack.plan_links(blocks, base_blocks, base_segments)
        return [b["id"] for b in blocks if b["id"] not in plan["reuse"]]

    state = source.state_dict(kv_for)
    blocks, reuse, linked = state["store"]["blocks"], plan["reuse"], plan["linked"]
    fresh = [b for b in blocks if b["id"] not in reuse]
    segment_name = f"seg-{fresh[0]['id']:09d}-{secrets.token_hex(4)}.safetensors" if fresh else None
    segment, segment_meta = pack.segment_tensors(fresh, model["geometry"]) if fresh else ({}, {})
    entries = [pack.block_entry(b, reuse.get(b["id"], segment_name)) for b in blocks]
    tensors = pack.state_tensors(blocks, model["geometry"]["n_layers"], model["position_dims"], state["policy"]["tensors"])
    return PreparedSnapshot(pack.manifest(identity, state, entries), tensors, segment_name, segment, segment_meta, linked,
                            base if linked else None, state["frames_ingested"], identity["policy"], model["fingerprint"],
                            new_blocks=len(fresh))


# --- load ---------------------------------------------------------------------------
def load_snapshot(source: Snapshottable, target: Path) -> SnapshotInfo:
    """Replace ``source``'s whole memory by the snapshot in ``target``.

    The manifest is checked first (format version, model fingerprint, policy, tokens per
    frame, KV geometry, the prompt sink's token ids), then every file's size and checksum, then
    every block is read back; only then does the engine take the state (``load_state_dict``:
    it builds the blocks and the policy validates its state before anything changes), so on
    any refusal (SnapshotError, with both values of a mismatch) the engine is unchanged. The
    current caps apply: a snapshot larger than the current budget or arena is restored, then
    evicted down to them (counted).

    A missing or damaged segment file is not a refusal (segments are shared between snapshots,
    ``read``): every block of every good segment is restored, the lost segment's blocks
    are left out, the policy's state is taken without them (``MemoryPolicy.without_blocks``), and
    the returned info names each lost segment with its reason and counts its blocks and frames
    (``lost_segments``, ``lost_blocks``, ``lost_frames``; ``loss()`` says it in words).
    """
    target = Path(target)
    identity = source.identity()
    manifest = read_manifest(target)
    check_compatible(identity, manifest, target)
    state = read_state(identity, manifest, target)
    try:
        source.load_state_dict(state)
    except PolicyStateError as exc:
        raise SnapshotError(f"snapshot {target}: {exc}") from exc
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise SnapshotError(f"snapshot {target} is malformed: {reason(exc)}") from exc
    stats, lost = source.stats(), state["lost"]
    return SnapshotInfo(target, stats.frames_in_memory, stats.frames_ingested, disk_bytes(target), identity["policy"],
                        identity["model"]["fingerprint"], lost_segments=tuple(lost["segments"].items()),
                        lost_blocks=len(lost["blocks"]), lost_frames=lost["frames"])
