"""Memory that survives restarts: the engine's whole state in a snapshot directory.

A snapshot is a directory with two files, never pickle:

    manifest.json    what the memory is: format version, model identity, policy, counters,
                     one entry per block (ids, camera, stamps, kind, stream, rank, tier, how many
                     tokens each layer keeps, the robot's pose at each stamp) and the policy's
                     state; plus the tensor file's sha256
    kv.safetensors   every tensor, named below

Tensors (B blocks in creation order; L layers; N_l tokens kept in layer l over all blocks;
P position rows; H_kv heads of dimension D). Per layer, not per block: a day of MuKV is
thousands of blocks, and one tensor per block and layer would make the file's header huge.

    blocks/positions      (P, sum of the blocks' encoded tokens) int64, the blocks' positions one after the other
    blocks/key_mean       (B, L, H_kv, D) float32
    blocks/rep            (R, ...) the representatives of the R blocks that have one, in block order
    layers/{l}/index      (N_l,) int64, kept token indices of the blocks holding layer l, in block order
    layers/{l}/logical    (P, N_l) int64
    layers/{l}/keys       (H_kv, N_l, D) the model's dtype, rotated at the encoding positions
    layers/{l}/values     (H_kv, N_l, D)
    policy/...            the policy's own tensors (``MemoryPolicy.state``)

What is not saved: the prompt sink (recomputed from the model: the fingerprint and the sink's
token ids are checked instead), what policies derive from the config and the model (guidance
and pseudo queries), latency windows and debugging fields.

Writing is atomic: everything goes into a sibling temporary directory ``.<name>.tmp-<hex>``,
files and directory fsynced, then renamed over the target. Renaming a directory over a
non-empty one is impossible, so an existing snapshot is first renamed aside to
``.<name>.old-<hex>``, the new one renamed in, the parent fsynced, and the old one deleted.
Crash windows (one writer per name: the node serialises saves on its model worker):

- before the first rename: the previous snapshot is intact; a ``.tmp-`` leftover is never
  read and the next successful save of the name deletes it;
- between the two renames: ``<name>`` is missing, ``.<name>.old-*`` is the previous complete
  snapshot and ``.<name>.tmp-*`` the new complete one (its manifest is written last);
  ``load_snapshot`` of the name says so, and renaming either back restores it;
- after the second rename: the new snapshot is in place; an ``.old-`` leftover is deleted by
  the next successful save.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file

from videokv_node.memory.block import FrameBlock, LayerKV, Tier
from videokv_node.pose import Pose

if TYPE_CHECKING:
    from videokv_node.memory.engine import VideoMemoryEngine

# Version 2 (issue 17) adds each block's ``poses`` (aligned with ``stamps_ns``, null where
# unknown) and the engine's ``pending_poses``; a version 1 snapshot loads with no poses.
SNAPSHOT_VERSION = 2
READABLE_VERSIONS = (1, 2)
FORMAT = "videokv-memory-snapshot"
MANIFEST = "manifest.json"
TENSORS = "kv.safetensors"
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")  # a plain name: no separator, not hidden, not . or ..


class SnapshotError(ValueError):
    """A snapshot that cannot be written, found or used; the message says which and why (returned verbatim)."""


@dataclass(frozen=True, slots=True)
class SnapshotInfo:
    path: Path  # the snapshot directory
    blocks: int  # blocks written; on load, blocks held once the current caps are enforced
    frames_ingested: int  # camera frames the memory had taken in when saved
    bytes: int  # size of the snapshot on disk (manifest + tensors)
    policy: str
    fingerprint: str  # the model's


# --- paths --------------------------------------------------------------------------
def resolve_snapshot_path(root: str | Path, name: str = "", path: str = "") -> Path:
    """The snapshot directory a request names, strictly inside ``root`` once symlinks are resolved.

    Exactly one of ``name`` (a plain name: letters, digits, ``._-``, not starting with ``.``)
    and ``path`` (relative to ``root``, or absolute) must be given. Nothing is created. The check
    holds for the file system as it is now: whoever can write links inside ``root`` is trusted.
    """
    if not str(root).strip():
        raise SnapshotError("snapshots are disabled: memory.snapshot_dir is empty")
    if bool(name) == bool(path):
        raise SnapshotError("give exactly one of a snapshot name or path")
    if name and not _NAME.fullmatch(name):
        raise SnapshotError(f"snapshot name {name!r} is not a plain name (letters, digits, '.', '_' and '-', not starting with '.')")
    try:
        base = Path(root).expanduser().resolve()
        p = Path(name or path).expanduser()
        resolved = (p if p.is_absolute() else base / p).resolve()
    except (ValueError, OSError, RuntimeError) as exc:  # a NUL byte, a symlink loop, a name too long
        raise SnapshotError(f"snapshot path {name or path!r} cannot be resolved: {exc}") from exc
    if base not in resolved.parents:
        raise SnapshotError(f"snapshot path {name or path!r} resolves to {resolved}, not inside memory.snapshot_dir {base}")
    return resolved


# --- dtypes in JSON -----------------------------------------------------------------
def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


# --- save ---------------------------------------------------------------------------
def save_snapshot(engine: "VideoMemoryEngine", target: Path) -> SnapshotInfo:
    """Write the engine's whole memory to the directory ``target``, atomically (module docstring).

    Call it from the thread that owns the engine. An existing ``target`` is replaced only if it
    is a snapshot directory. On any error nothing is left behind and a previous snapshot of the
    same name is intact. Peak host memory: about two copies of the memory's KV (gathered, then
    serialised).
    """
    target = Path(target)
    if target.is_symlink() or (target.exists() and not (target / MANIFEST).is_file()):
        raise SnapshotError(f"{target} exists and is not a snapshot directory: not replaced")
    manifest, tensors = _collect(engine)
    parent = target.parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = parent / f".{target.name}.tmp-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        kv = tmp / TENSORS
        save_file(tensors, str(kv))
        _fsync(kv)
        manifest["tensors"] = {"file": TENSORS, "bytes": kv.stat().st_size, "sha256": _sha256(kv)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, default=str))
        _fsync(tmp / MANIFEST)
        _fsync(tmp)
        _swap_in(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    for stale in _leftovers(target):  # of crashed saves: the new snapshot is complete now
        shutil.rmtree(stale, ignore_errors=True)
    return SnapshotInfo(target, len(manifest["blocks"]), engine.frames_ingested, _size(target), engine.policy.name,
                        engine.adapter.fingerprint())


def _collect(engine: "VideoMemoryEngine") -> tuple[dict, dict[str, torch.Tensor]]:
    """The manifest (without the tensor file's checksum) and the tensors, on the host."""
    store, adapter = engine.store, engine.adapter
    geo = adapter.geometry
    cpu = torch.device("cpu")
    blocks = list(store.blocks())
    entries, positions, key_means, reps = [], [], [], []
    per_layer: list[dict[str, list[torch.Tensor]]] = [{"index": [], "logical": [], "keys": [], "values": []} for _ in range(geo.n_layers)]
    for b in blocks:
        for layer, kv in enumerate(b.layers):
            if kv is None:
                continue
            k, v = store.layer_kv(b, layer, cpu)  # (H, t, D); offloaded blocks straight from the arena
            for key, t in (("index", kv.index), ("logical", kv.logical), ("keys", k), ("values", v)):
                per_layer[layer][key].append(t.cpu())
        positions.append(b.positions.cpu())
        key_means.append(b.key_mean.cpu())
        if b.rep is not None:
            reps.append(b.rep.cpu())
        entries.append(
            {
                "id": b.block_id,
                "camera": b.camera,
                "stamp_ns": b.stamp_ns,
                "stamps_ns": list(b.stamps_ns),
                "kind": b.kind,
                "stream": b.stream,
                "rank": b.rank,
                "protected": b.protected,
                "tier": b.tier.value,
                "n_tokens": b.n_tokens,
                "layer_tokens": [None if kv is None else kv.n_tokens for kv in b.layers],
                "rep": b.rep is not None,
                "poses": [None if p is None else p.as_dict() for p in b.poses],
            }
        )
    P, H, D = adapter.position_dims, geo.n_kv_heads, geo.head_dim
    tensors = {
        "blocks/positions": torch.cat(positions, dim=1) if positions else torch.zeros(P, 0, dtype=torch.long),
        "blocks/key_mean": torch.stack(key_means) if key_means else torch.zeros(0, geo.n_layers, H, D),
    }
    if reps:
        tensors["blocks/rep"] = torch.stack(reps)
    empty = {"index": (0,), "logical": (P, 0), "keys": (H, 0, D), "values": (H, 0, D)}  # a layer no block keeps
    for layer, parts in enumerate(per_layer):
        for key, ts in parts.items():
            if ts:
                tensors[f"layers/{layer}/{key}"] = torch.cat(ts, dim=-1 if key in ("index", "logical") else 1)
            else:
                tensors[f"layers/{layer}/{key}"] = torch.zeros(empty[key], dtype=geo.dtype if key in ("keys", "values") else torch.long)
    policy_meta, policy_tensors = engine.policy.state()
    for name, t in policy_tensors.items():
        # Copies: safetensors refuses tensors sharing memory, and views would save their whole base.
        tensors[f"policy/{name}"] = t.detach().to(cpu, memory_format=torch.contiguous_format, copy=True)
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
    return manifest, tensors


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


def _swap_in(tmp: Path, target: Path) -> None:
    """Rename the complete ``tmp`` to ``target``, replacing a previous snapshot (module docstring)."""
    parent = target.parent
    if not target.exists():
        os.rename(tmp, target)
        _fsync(parent)
        return
    aside = parent / f".{target.name}.old-{secrets.token_hex(4)}"
    os.rename(target, aside)
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(aside, target)
        raise
    _fsync(parent)
    shutil.rmtree(aside, ignore_errors=True)


def _leftovers(target: Path) -> list[Path]:
    """Temporary and set-aside directories of earlier saves of ``target`` that did not finish."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(tmp|old)-[0-9a-f]{{8}}")
    return sorted(p for p in target.parent.iterdir() if pattern.fullmatch(p.name) and p.is_dir() and not p.is_symlink())


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _size(target: Path) -> int:
    return sum(p.stat().st_size for p in (target / MANIFEST, target / TENSORS))


# --- load ---------------------------------------------------------------------------
def load_snapshot(engine: "VideoMemoryEngine", target: Path) -> SnapshotInfo:
    """Replace the engine's whole memory by the snapshot in ``target``.

    The manifest is checked first (format version, model fingerprint, policy, tokens per
    frame, KV geometry, the prompt sink's token ids), then the tensor file's checksum, then
    every block is built and the policy's state validated; only then is the memory swapped
    (``VideoMemoryEngine.replace_memory``), so on any refusal (SnapshotError, with both values
    of a mismatch) the engine is unchanged. The current caps apply: a snapshot larger than
    the current budget or arena is restored, then evicted down to them (counted).
    """
    target = Path(target)
    manifest = _read_manifest(target)
    _check_compatible(engine, manifest, target)
    tensors = _read_tensors(target, manifest)
    try:
        blocks = _build_blocks(engine, manifest, tensors)
        counters = {k: int(manifest["engine"][k]) for k in ("next_block_id", "frames_ingested", "evicted_blocks", "evicted_entries")}
        policy_meta = manifest["policy_state"]
        pending_poses = {(str(c), int(s)): Pose.from_dict(p) for c, s, p in manifest["engine"].get("pending_poses", [])}
        policy_tensors = {
            name.removeprefix("policy/"): t.to(engine.adapter.device) for name, t in tensors.items() if name.startswith("policy/")
        }
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise SnapshotError(f"snapshot {target} is malformed: {_why(exc)}") from exc
    del tensors  # the blocks hold their own copies (offloaded ones: views until the arena takes them)
    try:
        engine.replace_memory(blocks, policy_meta=policy_meta, policy_tensors=policy_tensors, pending_poses=pending_poses,
                              **counters)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise SnapshotError(f"snapshot {target}: the {engine.policy.name} policy's state does not fit: {_why(exc)}") from exc
    return SnapshotInfo(target, len(engine.store), engine.frames_ingested, _size(target), engine.policy.name,
                        engine.adapter.fingerprint())


def _why(exc: BaseException) -> str:
    return f"missing {exc}" if isinstance(exc, KeyError) else str(exc)


def _read_manifest(target: Path) -> dict:
    path = target / MANIFEST
    if not path.is_file():
        if target.exists():
            raise SnapshotError(f"{target}: not a snapshot (no manifest.json)")
        # A crash between a save's two renames leaves complete copies aside (the manifest is written last).
        aside = [p.name for p in _leftovers(target) if (p / MANIFEST).is_file()] if target.parent.is_dir() else []
        hint = f" (a save was interrupted: {', '.join(aside)} in {target.parent} are complete; rename one to {target.name})"
        raise SnapshotError(f"{target}: no snapshot{hint if aside else ''}")
    try:
        manifest = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SnapshotError(f"snapshot {target}: manifest.json is not valid JSON (truncated or corrupt): {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise SnapshotError(f"snapshot {target}: manifest.json is not a videokv memory snapshot manifest")
    return manifest


def _check_compatible(engine: "VideoMemoryEngine", manifest: dict, target: Path) -> None:
    """Refuse, with both values, a snapshot another version, model or policy wrote."""
    version = manifest.get("version")
    if version not in READABLE_VERSIONS:
        raise SnapshotError(f"snapshot {target} has format version {version!r}; this videokv reads version {SNAPSHOT_VERSION} "
                            f"and the older {', '.join(map(str, READABLE_VERSIONS[:-1]))}")
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


def _read_tensors(target: Path, manifest: dict) -> dict[str, torch.Tensor]:
    path = target / TENSORS
    want = manifest.get("tensors")
    if not isinstance(want, dict) or not path.is_file():
        raise SnapshotError(f"snapshot {target}: {TENSORS} is missing")
    size = path.stat().st_size
    if size != want.get("bytes") or _sha256(path) != want.get("sha256"):
        raise SnapshotError(
            f"snapshot {target}: {TENSORS} is corrupt ({size} bytes, sha256 differs from the manifest's: "
            f"{want.get('bytes')} bytes, {want.get('sha256')})"
        )
    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:  # safetensors raises its own error type for a bad header
        raise SnapshotError(f"snapshot {target}: {TENSORS} cannot be read: {exc}") from exc


def _build_blocks(engine: "VideoMemoryEngine", manifest: dict, tensors: dict[str, torch.Tensor]) -> list[FrameBlock]:
    """FrameBlocks from the manifest and tensors, every shape checked; resident K/V copied to the
    model's device, offloaded K/V left on the host for ``BlockStore.restore`` to page in."""
    adapter = engine.adapter
    geo, device = adapter.geometry, adapter.device
    L, H, D, P = geo.n_layers, geo.n_kv_heads, geo.head_dim, adapter.position_dims
    entries = manifest["blocks"]
    B = len(entries)
    n_tokens = [int(e["n_tokens"]) for e in entries]
    layer_tokens = [list(e["layer_tokens"]) for e in entries]
    if any(len(lt) != L for lt in layer_tokens):
        raise ValueError(f"every block needs {L} layer entries")
    positions = _expect(tensors, "blocks/positions", (P, sum(n_tokens)), torch.long)
    key_mean = _expect(tensors, "blocks/key_mean", (B, L, H, D), torch.float32)
    n_reps = sum(bool(e["rep"]) for e in entries)
    reps = tensors.get("blocks/rep")
    if (reps.shape[0] if reps is not None else 0) != n_reps:
        raise ValueError(f"{n_reps} blocks have a representative, blocks/rep holds {0 if reps is None else reps.shape[0]}")
    layers = []
    for l in range(L):
        n = sum(int(lt[l]) for lt in layer_tokens if lt[l] is not None)
        layers.append(
            (
                _expect(tensors, f"layers/{l}/index", (n,), torch.long),
                _expect(tensors, f"layers/{l}/logical", (P, n), torch.long),
                _expect(tensors, f"layers/{l}/keys", (H, n, D), geo.dtype),
                _expect(tensors, f"layers/{l}/values", (H, n, D), geo.dtype),
            )
        )
    at_pos, at_rep, at_layer = 0, 0, [0] * L
    blocks, last_id = [], -1
    for i, e in enumerate(entries):
        block_id, tier, t = int(e["id"]), Tier(e["tier"]), n_tokens[i]
        if block_id <= last_id or t < 1:
            raise ValueError(f"block {block_id}: ids must increase and blocks hold tokens")
        last_id = block_id
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
            k, v = keys[:, sl], values[:, sl]  # (H, kept, D)
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
            positions=positions[:, at_pos : at_pos + t].clone(),
            key_mean=key_mean[i].clone(),
            layers=kvs,
            kind=str(e["kind"]),
            stream=str(e["stream"]),
            stamps_ns=tuple(int(s) for s in e["stamps_ns"]),
            rank=int(e["rank"]),
            protected=bool(e["protected"]),
            rep=rep,
            tier=tier,
            poses=_poses(e),
        )
        at_pos += t
        if block.is_empty:
            raise ValueError(f"block {block_id} keeps nothing in any layer")
        blocks.append(block)
    return blocks


def _poses(entry: dict) -> tuple:
    """A block entry's poses, aligned with its stamps (or none at all); none in a version 1 snapshot."""
    poses = entry.get("poses")
    if not poses:  # version 1, or a block a policy made itself (no frame, no pose)
        return ()
    if len(poses) != len(entry["stamps_ns"]):
        raise ValueError(f"block {entry['id']}: {len(poses)} poses for {len(entry['stamps_ns'])} stamps")
    return tuple(None if p is None else Pose.from_dict(p) for p in poses)


def _expect(tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    t = tensors[name]
    if tuple(t.shape) != shape or t.dtype != dtype:
        raise ValueError(f"{name} is {tuple(t.shape)} {dtype_name(t.dtype)}, the manifest needs {shape} {dtype_name(dtype)}")
    return t
