"""Memory that survives restarts: the engine's whole state in a snapshot directory.

A snapshot (format version 3) is a directory of safetensors files and a manifest, never pickle:

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
kept token and layer, against the K/V's 2 x heads x head_dim x dtype bytes).

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
    state: policy/...          the policy's own tensors (``MemoryPolicy.state``)

What is not saved: the prompt sink (recomputed from the model: the fingerprint and the sink's
token ids are checked instead), what policies derive from the config and the model (guidance
and pseudo queries), latency windows and debugging fields. Version 1 snapshots (one
``kv.safetensors``, no segments) still load.

Writing is atomic (``snapshot_files``): everything goes into a sibling temporary directory,
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

import dataclasses
import json
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from videokv_node.memory.block import FrameBlock, LayerKV, Tier
from videokv_node.memory.snapshot_files import (
    MANIFEST,
    SnapshotError,
    disk_bytes,
    dtype_from_name,
    dtype_name,
    fsync,
    leftovers,
    new_temporary,
    resolve_snapshot_path,
    sha256,
    share_file,
    swap_in,
)
from videokv_node.pose import Pose

if TYPE_CHECKING:
    from videokv_node.memory.engine import VideoMemoryEngine

__all__ = [
    "SNAPSHOT_VERSION", "SnapshotError", "SnapshotInfo", "PreparedSnapshot", "prepare_snapshot", "save_snapshot",
    "load_snapshot", "resolve_snapshot_path", "dtype_name", "dtype_from_name",
]

# Version 3 (issue 17) adds each block's ``poses`` (aligned with ``stamps_ns``, null where
# unknown) and the engine's ``pending_poses``; it is version 2 otherwise. Versions 1 and 2 load
# with no poses.
SNAPSHOT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
SEGMENTED_VERSIONS = (2, 3)  # stored as segments + state file (version 1: one kv.safetensors)
FORMAT = "videokv-memory-snapshot"
STATE = "state.safetensors"
TENSORS_V1 = "kv.safetensors"
COMPACT_BELOW = 0.5  # a base segment with fewer live entries than this share of its own is rewritten, not linked


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


def save_snapshot(engine: "VideoMemoryEngine", target: Path, base: Path | None = None) -> SnapshotInfo:
    """Write the engine's whole memory to the directory ``target`` (``prepare_snapshot`` then ``write``).

    Call it from the thread that owns the engine. Peak host memory: about two copies of what
    it writes (gathered, then serialised).
    """
    return prepare_snapshot(engine, base).write(Path(target))


def prepare_snapshot(engine: "VideoMemoryEngine", base: Path | None = None) -> PreparedSnapshot:
    """Copy what a snapshot must write out of the engine (call it on the thread that owns the engine).

    With ``base`` (an earlier version-2 snapshot of the same model), blocks stored there at
    their current revision are not copied: their segments will be linked. An unreadable or
    foreign base is ignored (everything is written).
    """
    store, adapter = engine.store, engine.adapter
    geo = adapter.geometry
    blocks = list(store.blocks())
    base_blocks, base_segments = _base_index(engine, base)
    # Which blocks the base holds, and which of its segments are worth linking.
    reuse: dict[int, str] = {}
    live: dict[str, int] = {}
    for b in blocks:
        seg = base_blocks.get(b.block_id)
        if seg is not None and seg[1] == b.revision:
            reuse[b.block_id] = seg[0]
            live[seg[0]] = live.get(seg[0], 0) + b.entries
    linked = {name: base_segments[name] for name, n in live.items()
              if n >= COMPACT_BELOW * int(base_segments[name]["entries"])}
    reuse = {i: s for i, s in reuse.items() if s in linked}
    fresh = [b for b in blocks if b.block_id not in reuse]
    segment_name = f"seg-{fresh[0].block_id:09d}-{secrets.token_hex(4)}.safetensors" if fresh else None
    segment, segment_meta = _segment_tensors(engine, fresh) if fresh else ({}, {})

    cpu = torch.device("cpu")
    entries, reps = [], []
    per_layer: list[dict[str, list[torch.Tensor]]] = [{"index": [], "logical": []} for _ in range(geo.n_layers)]
    for b in blocks:
        for layer, kv in enumerate(b.layers):
            if kv is not None:
                per_layer[layer]["index"].append(kv.index.cpu())
                per_layer[layer]["logical"].append(kv.logical.cpu())
        if b.rep is not None:
            reps.append(b.rep.cpu())
        entries.append({
            "id": b.block_id, "camera": b.camera, "stamp_ns": b.stamp_ns, "stamps_ns": list(b.stamps_ns),
            "kind": b.kind, "stream": b.stream, "rank": b.rank, "protected": b.protected, "tier": b.tier.value,
            "n_tokens": b.n_tokens, "layer_tokens": [None if kv is None else kv.n_tokens for kv in b.layers],
            "rep": b.rep is not None, "revision": b.revision, "segment": reuse.get(b.block_id, segment_name),
            "poses": [None if p is None else p.as_dict() for p in b.poses],
        })
    P = adapter.position_dims
    state: dict[str, torch.Tensor] = {}
    for layer, parts in enumerate(per_layer):
        state[f"layers/{layer}/index"] = torch.cat(parts["index"]) if parts["index"] else torch.zeros(0, dtype=torch.long)
        state[f"layers/{layer}/logical"] = torch.cat(parts["logical"], dim=1) if parts["logical"] else torch.zeros(P, 0, dtype=torch.long)
    if reps:
        state["blocks/rep"] = torch.stack(reps)
    policy_meta, policy_tensors = engine.policy.state()
    for name, t in policy_tensors.items():
        # Copies: safetensors refuses tensors sharing memory, and views would save their whole base.
        state[f"policy/{name}"] = t.detach().to(cpu, memory_format=torch.contiguous_format, copy=True)
    manifest = {
        "format": FORMAT,
        "version": SNAPSHOT_VERSION,
        "model": _model_identity(engine),
        "policy": engine.policy.name,
        "config": dataclasses.asdict(engine.config),  # what it was saved under (for people; not checked)
        "engine": {
            "next_block_id": engine.next_block_id,
            "frames_ingested": engine.frames_ingested,
            "evicted_blocks": store.evicted_blocks,
            "evicted_entries": store.evicted_entries,
            "pending_poses": [[c, s, p.as_dict()] for (c, s), p in sorted(engine.pending_poses().items())],
        },
        "blocks": entries,
        "policy_state": policy_meta,
    }
    return PreparedSnapshot(manifest, state, segment_name, segment, segment_meta, linked, base if linked else None,
                            engine.frames_ingested, engine.policy.name, adapter.fingerprint(), new_blocks=len(fresh))


def _segment_tensors(engine: "VideoMemoryEngine", blocks: list[FrameBlock]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The immutable part of ``blocks`` as one segment's tensors (host copies) and its metadata."""
    store, geo = engine.store, engine.adapter.geometry
    H, D = geo.n_kv_heads, geo.head_dim
    cpu = torch.device("cpu")
    per_layer: list[dict[str, list[torch.Tensor]]] = [{"index": [], "keys": [], "values": []} for _ in range(geo.n_layers)]
    listing, entries = [], 0
    for b in blocks:
        for layer, kv in enumerate(b.layers):
            if kv is None:
                continue
            k, v = store.layer_kv(b, layer, cpu)  # (H, t, D); offloaded blocks straight from the arena
            per_layer[layer]["index"].append(kv.index.cpu())
            per_layer[layer]["keys"].append(k.cpu())
            per_layer[layer]["values"].append(v.cpu())
        listing.append([b.block_id, b.n_tokens, [None if kv is None else kv.n_tokens for kv in b.layers]])
        entries += b.entries
    tensors = {
        "blocks/positions": torch.cat([b.positions.cpu() for b in blocks], dim=1),  # (P, sum T)
        "blocks/key_mean": torch.stack([b.key_mean.cpu() for b in blocks]),  # (B, L, H, D)
    }
    for layer, parts in enumerate(per_layer):
        if parts["index"]:
            tensors[f"layers/{layer}/index"] = torch.cat(parts["index"])
            tensors[f"layers/{layer}/keys"] = torch.cat(parts["keys"], dim=1)  # (H, S_l, D)
            tensors[f"layers/{layer}/values"] = torch.cat(parts["values"], dim=1)
        else:
            tensors[f"layers/{layer}/index"] = torch.zeros(0, dtype=torch.long)
            tensors[f"layers/{layer}/keys"] = torch.zeros(H, 0, D, dtype=geo.dtype)
            tensors[f"layers/{layer}/values"] = torch.zeros(H, 0, D, dtype=geo.dtype)
    return tensors, {"blocks": json.dumps(listing), "entries": str(entries)}


def _base_index(engine: "VideoMemoryEngine", base: Path | None) -> tuple[dict[int, tuple[str, int]], dict[str, dict]]:
    """block id -> (segment, revision) and segment name -> record of a usable base snapshot, else empty."""
    if base is None:
        return {}, {}
    try:
        manifest = json.loads((Path(base) / MANIFEST).read_text())
        # Versions 2 and 3 share the segment layout (3 adds poses, which live in the manifest, rewritten each time).
        if manifest.get("version") not in SEGMENTED_VERSIONS or manifest.get("model", {}).get("fingerprint") != engine.adapter.fingerprint():
            return {}, {}
        segments = {name: rec for name, rec in manifest["segments"].items() if (Path(base) / name).is_file()}
        blocks = {int(e["id"]): (e["segment"], int(e["revision"])) for e in manifest["blocks"] if e["segment"] in segments}
        return blocks, segments
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}, {}


def _model_identity(engine: "VideoMemoryEngine") -> dict:
    adapter = engine.adapter
    geo = adapter.geometry
    return {
        "name": adapter.name,
        "fingerprint": adapter.fingerprint(),
        "tokens_per_frame": adapter.tokens_per_frame,
        "position_dims": adapter.position_dims,
        "geometry": {
            "n_layers": geo.n_layers,
            "n_kv_heads": geo.n_kv_heads,
            "head_dim": geo.head_dim,
            "n_q_heads": geo.n_q_heads,
            "dtype": dtype_name(geo.dtype),
        },
        "sink_ids": list(adapter.prefix_ids()),
    }


# --- load ---------------------------------------------------------------------------
def read_manifest(target: Path) -> dict:
    """The manifest of the snapshot in ``target``, or SnapshotError saying why there is none."""
    target = Path(target)
    path = target / MANIFEST
    if not path.is_file():
        if target.exists():
            raise SnapshotError(f"{target}: not a snapshot (no manifest.json)")
        # A crash between a save's two renames leaves complete copies aside (the manifest is written last).
        aside = [p.name for p in leftovers(target) if (p / MANIFEST).is_file()] if target.parent.is_dir() else []
        hint = f" (a save was interrupted: {', '.join(aside)} in {target.parent} are complete; rename one to {target.name})"
        raise SnapshotError(f"{target}: no snapshot{hint if aside else ''}")
    try:
        manifest = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SnapshotError(f"snapshot {target}: manifest.json is not valid JSON (truncated or corrupt): {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise SnapshotError(f"snapshot {target}: manifest.json is not a videokv memory snapshot manifest")
    return manifest


def load_snapshot(engine: "VideoMemoryEngine", target: Path) -> SnapshotInfo:
    """Replace the engine's whole memory by the snapshot in ``target``.

    The manifest is checked first (format version, model fingerprint, policy, tokens per
    frame, KV geometry, the prompt sink's token ids), then every file's size and checksum, then
    every block is built and the policy's state validated; only then is the memory swapped
    (``VideoMemoryEngine.replace_memory``), so on any refusal (SnapshotError, with both values
    of a mismatch) the engine is unchanged. The current caps apply: a snapshot larger than
    the current budget or arena is restored, then evicted down to them (counted).
    """
    target = Path(target)
    manifest = read_manifest(target)
    _check_compatible(engine, manifest, target)
    if manifest["version"] == 1:
        state = _read_checked(target, TENSORS_V1, manifest.get("tensors"))
        segments = None
    else:
        state = _read_checked(target, STATE, manifest.get("state"))
        records = manifest.get("segments")
        if not isinstance(records, dict):
            raise SnapshotError(f"snapshot {target} is malformed: no segment list")
        segments = {name: _read_segment(target, name, record) for name, record in records.items()}
    try:
        blocks = _build_blocks(engine, manifest, state, segments)
        counters = {k: int(manifest["engine"][k]) for k in ("next_block_id", "frames_ingested", "evicted_blocks", "evicted_entries")}
        policy_meta = manifest["policy_state"]
        pending_poses = {(str(c), int(s)): Pose.from_dict(p) for c, s, p in manifest["engine"].get("pending_poses", [])}
        policy_tensors = {
            name.removeprefix("policy/"): t.to(engine.adapter.device) for name, t in state.items() if name.startswith("policy/")
        }
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise SnapshotError(f"snapshot {target} is malformed: {_why(exc)}") from exc
    del state, segments  # the blocks hold their own copies (offloaded ones: views until the arena takes them)
    try:
        engine.replace_memory(blocks, policy_meta=policy_meta, policy_tensors=policy_tensors, pending_poses=pending_poses,
                              **counters)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise SnapshotError(f"snapshot {target}: the {engine.policy.name} policy's state does not fit: {_why(exc)}") from exc
    return SnapshotInfo(target, len(engine.store), engine.frames_ingested, disk_bytes(target), engine.policy.name,
                        engine.adapter.fingerprint())


def _why(exc: BaseException) -> str:
    return f"missing {exc}" if isinstance(exc, KeyError) else str(exc)


def _check_compatible(engine: "VideoMemoryEngine", manifest: dict, target: Path) -> None:
    """Refuse, with both values, a snapshot another version, model or policy wrote."""
    version = manifest.get("version")
    if version not in READABLE_VERSIONS:
        raise SnapshotError(f"snapshot {target} has format version {version!r}; this videokv reads versions "
                            f"{', '.join(map(str, READABLE_VERSIONS))} (writes {SNAPSHOT_VERSION})")
    saved, now = manifest.get("model"), _model_identity(engine)
    if not isinstance(saved, dict):
        raise SnapshotError(f"snapshot {target} is malformed: no model identity")
    if saved.get("fingerprint") != now["fingerprint"]:
        raise SnapshotError(
            f"snapshot {target} was saved with model {saved.get('name')!r} (fingerprint {saved.get('fingerprint')}), "
            f"the loaded model is {now['name']!r} (fingerprint {now['fingerprint']}): KV of another model would give wrong answers"
        )
    if manifest.get("policy") != engine.policy.name:
        raise SnapshotError(
            f"snapshot {target} holds a {manifest.get('policy')!r} memory; memory.policy is {engine.policy.name!r}"
        )
    for key in ("tokens_per_frame", "position_dims", "geometry"):
        if saved.get(key) != now[key]:
            raise SnapshotError(f"snapshot {target}: {key} is {saved.get(key)} in the snapshot, {now[key]} now")
    if saved.get("sink_ids") != now["sink_ids"]:
        a, b = saved.get("sink_ids") or [], now["sink_ids"]
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        raise SnapshotError(
            f"snapshot {target}: the prompt sink differs from token {at} on (snapshot {len(a)} tokens {a[at:at + 4]}..., "
            f"now {len(b)} tokens {b[at:at + 4]}...): the memory was encoded after another prompt"
        )


def _read_checked(target: Path, name: str, want) -> dict[str, torch.Tensor]:
    """A safetensors file of the snapshot whose size and sha256 match the manifest's record."""
    path = target / name
    if not isinstance(want, dict) or not path.is_file():
        raise SnapshotError(f"snapshot {target}: {name} is missing")
    size = path.stat().st_size
    if size != want.get("bytes") or sha256(path) != want.get("sha256"):
        raise SnapshotError(
            f"snapshot {target}: {name} is corrupt ({size} bytes, sha256 differs from the manifest's: "
            f"{want.get('bytes')} bytes, {want.get('sha256')})"
        )
    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:  # safetensors raises its own error type for a bad header
        raise SnapshotError(f"snapshot {target}: {name} cannot be read: {exc}") from exc


def _read_segment(target: Path, name: str, record) -> tuple[list, dict[str, torch.Tensor]]:
    """(block listing, tensors) of one checked segment file."""
    if not isinstance(name, str) or "/" in name or not name.startswith("seg-"):
        raise SnapshotError(f"snapshot {target} is malformed: segment name {name!r}")
    tensors = _read_checked(target, name, record)
    try:
        with safe_open(str(target / name), framework="pt") as f:
            listing = json.loads((f.metadata() or {})["blocks"])
    except Exception as exc:
        raise SnapshotError(f"snapshot {target}: segment {name} has no readable block list: {exc}") from exc
    return listing, tensors


@dataclass(slots=True)
class _Stored:
    """One block's immutable part: encoding positions, mean key, per layer the stored (index, keys, values)."""

    positions: torch.Tensor
    key_mean: torch.Tensor
    layers: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]


def _stored_blocks(engine: "VideoMemoryEngine", name: str, listing: list, tensors: dict[str, torch.Tensor]) -> dict[int, _Stored]:
    geo, P = engine.adapter.geometry, engine.adapter.position_dims
    L, H, D = geo.n_layers, geo.n_kv_heads, geo.head_dim
    n_tokens = [int(t) for _, t, _ in listing]
    layer_tokens = [list(lt) for _, _, lt in listing]
    if any(len(lt) != L for lt in layer_tokens):
        raise ValueError(f"segment {name}: every block needs {L} layer entries")
    positions = _expect(tensors, "blocks/positions", (P, sum(n_tokens)), torch.long, name)
    key_mean = _expect(tensors, "blocks/key_mean", (len(listing), L, H, D), torch.float32, name)
    layers = []
    for l in range(L):
        n = sum(int(lt[l]) for lt in layer_tokens if lt[l] is not None)
        layers.append((
            _expect(tensors, f"layers/{l}/index", (n,), torch.long, name),
            _expect(tensors, f"layers/{l}/keys", (H, n, D), geo.dtype, name),
            _expect(tensors, f"layers/{l}/values", (H, n, D), geo.dtype, name),
        ))
    out, at_pos, at_layer = {}, 0, [0] * L
    for i, (block_id, t, lt) in enumerate(listing):
        per = []
        for l, kept in enumerate(lt):
            if kept is None:
                per.append(None)
                continue
            sl = slice(at_layer[l], at_layer[l] + int(kept))
            at_layer[l] += int(kept)
            per.append((layers[l][0][sl], layers[l][1][:, sl], layers[l][2][:, sl]))
        out[int(block_id)] = _Stored(positions[:, at_pos : at_pos + int(t)], key_mean[i], per)
        at_pos += int(t)
    return out


def _build_blocks(engine: "VideoMemoryEngine", manifest: dict, state: dict[str, torch.Tensor],
                  segments: dict[str, tuple[list, dict[str, torch.Tensor]]] | None) -> list[FrameBlock]:
    """FrameBlocks from the manifest and tensors, every shape checked; resident K/V copied to the
    model's device, offloaded K/V left on the host for ``BlockStore.restore`` to page in.

    Version 1 (``segments`` None): ``state`` is the one tensor file, holding every block's K/V.
    """
    adapter = engine.adapter
    geo, device = adapter.geometry, adapter.device
    L, H, D, P = geo.n_layers, geo.n_kv_heads, geo.head_dim, adapter.position_dims
    entries = manifest["blocks"]
    B = len(entries)
    n_tokens = [int(e["n_tokens"]) for e in entries]
    layer_tokens = [list(e["layer_tokens"]) for e in entries]
    if any(len(lt) != L for lt in layer_tokens):
        raise ValueError(f"every block needs {L} layer entries")
    n_reps = sum(bool(e["rep"]) for e in entries)
    reps = state.get("blocks/rep")
    if (reps.shape[0] if reps is not None else 0) != n_reps:
        raise ValueError(f"{n_reps} blocks have a representative, blocks/rep holds {0 if reps is None else reps.shape[0]}")
    layers = []
    for l in range(L):
        n = sum(int(lt[l]) for lt in layer_tokens if lt[l] is not None)
        index = _expect(state, f"layers/{l}/index", (n,), torch.long)
        logical = _expect(state, f"layers/{l}/logical", (P, n), torch.long)
        if segments is None:
            layers.append((index, logical, _expect(state, f"layers/{l}/keys", (H, n, D), geo.dtype),
                           _expect(state, f"layers/{l}/values", (H, n, D), geo.dtype)))
        else:
            layers.append((index, logical, None, None))
    if segments is None:
        positions = _expect(state, "blocks/positions", (P, sum(n_tokens)), torch.long)
        key_mean = _expect(state, "blocks/key_mean", (B, L, H, D), torch.float32)
        stored = None
    else:
        stored = {}
        for name, (listing, tensors) in segments.items():
            stored[name] = _stored_blocks(engine, name, listing, tensors)
    at_pos, at_rep, at_layer = 0, 0, [0] * L
    blocks, last_id = [], -1
    for i, e in enumerate(entries):
        block_id, tier, t = int(e["id"]), Tier(e["tier"]), n_tokens[i]
        if block_id <= last_id or t < 1:
            raise ValueError(f"block {block_id}: ids must increase and blocks hold tokens")
        last_id = block_id
        if stored is not None:
            seg = stored.get(e["segment"])
            if seg is None or block_id not in seg:
                raise ValueError(f"block {block_id}: its segment {e['segment']!r} does not hold it")
            mine = seg[block_id]
            if tuple(mine.positions.shape) != (P, t):
                raise ValueError(f"block {block_id}: {t} tokens in the manifest, {mine.positions.shape[1]} in its segment")
        kvs: list[LayerKV | None] = []
        for l, kept in enumerate(layer_tokens[i]):
            if kept is None:
                kvs.append(None)
                continue
            kept = int(kept)
            index, logical, keys, values = layers[l]
            sl = slice(at_layer[l], at_layer[l] + kept)
            at_layer[l] += kept
            idx = index[sl].clone()
            if kept < 1 or int(idx.min()) < 0 or int(idx.max()) >= t or not bool((idx[1:] > idx[:-1]).all()):
                raise ValueError(f"block {block_id} layer {l}: kept token indices must ascend within its {t} tokens")
            if stored is None:
                k, v = keys[:, sl], values[:, sl]  # (H, kept, D)
            else:
                k, v = _gather_stored(block_id, l, mine.layers[l], idx)
            if tier is Tier.RESIDENT:
                k = k.to(device, memory_format=torch.contiguous_format, copy=True)
                v = v.to(device, memory_format=torch.contiguous_format, copy=True)
            kvs.append(LayerKV(idx, logical[:, sl].clone(), k, v))
        rep = None
        if e["rep"]:
            rep = reps[at_rep].clone()
            at_rep += 1
        block = FrameBlock(
            block_id=block_id,
            camera=str(e["camera"]),
            stamp_ns=int(e["stamp_ns"]),
            positions=(positions[:, at_pos : at_pos + t] if stored is None else mine.positions).clone(),
            key_mean=(key_mean[i] if stored is None else mine.key_mean).clone(),
            layers=kvs,
            kind=str(e["kind"]),
            stream=str(e["stream"]),
            stamps_ns=tuple(int(s) for s in e["stamps_ns"]),
            rank=int(e["rank"]),
            protected=bool(e["protected"]),
            rep=rep,
            tier=tier,
            revision=int(e.get("revision", 0)),
            poses=_poses(e),
        )
        at_pos += t
        if block.is_empty:
            raise ValueError(f"block {block_id} keeps nothing in any layer")
        blocks.append(block)
    return blocks


def _gather_stored(block_id: int, layer: int, stored, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (H, n, D) K/V of the kept tokens ``idx`` from a block's stored layer (a superset, ascending)."""
    if stored is None:
        raise ValueError(f"block {block_id} layer {layer}: kept now but not stored in its segment")
    s_idx, s_k, s_v = stored
    at = torch.searchsorted(s_idx, idx)
    if bool((at >= s_idx.numel()).any()) or not torch.equal(s_idx[at.clamp(max=max(s_idx.numel() - 1, 0))], idx):
        raise ValueError(f"block {block_id} layer {layer}: kept tokens are not among those its segment stores")
    return s_k[:, at], s_v[:, at]


def _poses(entry: dict) -> tuple:
    """A block entry's poses, aligned with its stamps (or none at all); none before version 3."""
    poses = entry.get("poses")
    if not poses:  # versions 1 and 2, or a block a policy made itself (no frame, no pose)
        return ()
    if len(poses) != len(entry["stamps_ns"]):
        raise ValueError(f"block {entry['id']}: {len(poses)} poses for {len(entry['stamps_ns'])} stamps")
    return tuple(None if p is None else Pose.from_dict(p) for p in poses)


def _expect(tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...], dtype: torch.dtype, where: str = "") -> torch.Tensor:
    t = tensors[name]
    if tuple(t.shape) != shape or t.dtype != dtype:
        raise ValueError(f"{where + ': ' if where else ''}{name} is {tuple(t.shape)} {dtype_name(t.dtype)}, "
                         f"the manifest needs {shape} {dtype_name(dtype)}")
    return t
