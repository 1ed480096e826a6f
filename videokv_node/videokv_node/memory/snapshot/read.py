"""A snapshot's files read back, every record and shape checked, into an engine's state dict.

The inverse of ``pack.py``: nothing here changes a memory; ``format.load_snapshot``
hands the state dict to the engine's ``load_state_dict``. Every tensor stays on the host
(the engine moves what is resident to its device). Refusals are ``SnapshotError`` saying
which file or field and why, with both values of a mismatch.

A segment degrades, it does not refuse: segments are shared by hard links between the
snapshots of a series, so a damaged one would otherwise cost every snapshot that links it.
A segment that is missing, fails its size or checksum, or cannot be read is *lost*: the
blocks it holds are left out of the state (``state["lost"]`` names the segment, why, the
blocks and the camera frames no other block still covers) and every other block is read
as if nothing happened. What stays refused: the manifest and the state file (one per
snapshot, never shared), and any block a readable segment does not hold as the manifest says.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from videokv_node.memory.snapshot.files import MANIFEST, SnapshotError, leftovers, sha256
from videokv_node.memory.snapshot.pack import FORMAT, READABLE_VERSIONS, SNAPSHOT_VERSION, STATE, TENSORS_V1
from videokv_node.memory.records.state import dtype_from_name, dtype_name, reason
from videokv_node.pose import Pose


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


def check_compatible(identity: dict, manifest: dict, target: Path) -> None:
    """Refuse, with both values, a snapshot another version, model or policy wrote (``identity``:
    the engine's, ``EngineState.identity``)."""
    version = manifest.get("version")
    if version not in READABLE_VERSIONS:
        raise SnapshotError(f"snapshot {target} has format version {version!r}; this videokv reads versions "
                            f"{', '.join(map(str, READABLE_VERSIONS))} (writes {SNAPSHOT_VERSION})")
    saved, now = manifest.get("model"), identity["model"]
    if not isinstance(saved, dict):
        raise SnapshotError(f"snapshot {target} is malformed: no model identity")
    if saved.get("fingerprint") != now["fingerprint"]:
        raise SnapshotError(
            f"snapshot {target} was saved with model {saved.get('name')!r} (fingerprint {saved.get('fingerprint')}), "
            f"the loaded model is {now['name']!r} (fingerprint {now['fingerprint']}): KV of another model would give wrong answers"
        )
    if manifest.get("policy") != identity["policy"]:
        raise SnapshotError(f"snapshot {target} holds a {manifest.get('policy')!r} memory; memory.policy is {identity['policy']!r}")
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


def read_state(identity: dict, manifest: dict, target: Path) -> dict:
    """The engine state dict (``EngineState.state_dict``'s layout) a checked manifest describes,
    read from its files, less the blocks of lost segments (module docstring), with ``"lost"``:
    ``{"segments": {name: reason}, "blocks": [ids], "frames": camera frames left uncovered}``.
    SnapshotError for a missing, corrupt or malformed manifest, state file or field."""
    lost: dict[str, str] = {}  # segment name -> why it is lost
    if manifest["version"] == 1:
        tensors = _read_checked(target, TENSORS_V1, manifest.get("tensors"))
        segments = None
    else:
        tensors = _read_checked(target, STATE, manifest.get("state"))
        records = manifest.get("segments")
        if not isinstance(records, dict):
            raise SnapshotError(f"snapshot {target} is malformed: no segment list")
        segments = {}
        for name, record in records.items():
            try:
                segments[name] = _stored_blocks(identity["model"], name, *_read_segment(target, name, record))
            except (SnapshotError, OSError, KeyError, TypeError, ValueError, IndexError) as exc:  # OSError: EIO on a bad block
                lost[name] = reason(exc)
    try:
        engine = manifest["engine"]
        blocks = _block_states(identity["model"], manifest, tensors, segments, lost)
        return {
            "next_block_id": int(engine["next_block_id"]),
            "frames_ingested": int(engine["frames_ingested"]),
            "pending_poses": {(str(c), int(s)): Pose.from_dict(p) for c, s, p in engine.get("pending_poses", [])},
            "pending_words": {(str(c), int(s)): _words(w, f"pending frame {c} {s}") for c, s, w in engine.get("pending_words", [])},
            "store": {
                "blocks": blocks,
                "evicted_blocks": int(engine["evicted_blocks"]),
                "evicted_entries": int(engine["evicted_entries"]),
            },
            "policy": {
                "meta": manifest["policy_state"],
                "tensors": {name.removeprefix("policy/"): t for name, t in tensors.items() if name.startswith("policy/")},
            },
            "config": manifest.get("config"),
            "lost": _lost(manifest["blocks"], lost),
        }
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise SnapshotError(f"snapshot {target} is malformed: {reason(exc)}") from exc


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


def _lost(entries: list[dict], lost: dict[str, str]) -> dict:
    """What the lost segments cost: their names and reasons, the ids of the blocks they held, and
    the camera frames (camera, stamp) that only those blocks covered (MuKV's patch, frame and
    segment blocks of one frame, StreamKV's frames and their segment's summary, may sit in
    different segments; summary tokens cover no camera frame)."""
    gone = [e for e in entries if e.get("segment") in lost]
    kept = _frames(e for e in entries if e.get("segment") not in lost)
    return {"segments": dict(lost), "blocks": [int(e["id"]) for e in gone], "frames": len(_frames(gone) - kept)}


def _frames(entries) -> set[tuple[str, int]]:
    """The camera frames (camera, stamp) block entries cover."""
    return {(str(e["camera"]), int(s)) for e in entries if e["kind"] != "summary" for s in e["stamps_ns"]}


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


def _stored_blocks(model: dict, name: str, listing: list, tensors: dict[str, torch.Tensor]) -> dict[int, _Stored]:
    geo, P = model["geometry"], model["position_dims"]
    L, H, D, dtype = geo["n_layers"], geo["n_kv_heads"], geo["head_dim"], dtype_from_name(geo["dtype"])
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
            _expect(tensors, f"layers/{l}/keys", (H, n, D), dtype, name),
            _expect(tensors, f"layers/{l}/values", (H, n, D), dtype, name),
        ))
    out, at_pos, at_layer = {}, 0, [0] * L
    for i, (block_id, t, lt) in enumerate(listing):
        per: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None] = []
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


def _block_states(model: dict, manifest: dict, state: dict[str, torch.Tensor],
                  stored: dict[str, dict[int, _Stored]] | None, lost: dict[str, str]) -> list[dict]:
    """Block state dicts (``FrameBlock.state_dict`` plus each layer's K/V) from the manifest and
    tensors, every shape checked; host tensors, copies of the files' (no views into them). The
    blocks of ``lost`` segments are left out (their rows of the state file are skipped).

    Version 1 (``stored`` None): ``state`` is the one tensor file, holding every block's K/V.
    """
    geo, P = model["geometry"], model["position_dims"]
    L, H, D, dtype = geo["n_layers"], geo["n_kv_heads"], geo["head_dim"], dtype_from_name(geo["dtype"])
    entries = manifest["blocks"]
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
        if stored is None:
            layers.append((index, logical, _expect(state, f"layers/{l}/keys", (H, n, D), dtype),
                           _expect(state, f"layers/{l}/values", (H, n, D), dtype)))
        else:
            layers.append((index, logical, None, None))
    if stored is None:
        positions = _expect(state, "blocks/positions", (P, sum(n_tokens)), torch.long)
        key_mean = _expect(state, "blocks/key_mean", (len(entries), L, H, D), torch.float32)
    at_pos, at_rep, at_layer = 0, 0, [0] * L
    blocks, last_id = [], -1
    for i, e in enumerate(entries):
        block_id, t = int(e["id"]), n_tokens[i]
        if block_id <= last_id or t < 1:
            raise ValueError(f"block {block_id}: ids must increase and blocks hold tokens")
        last_id = block_id
        if stored is not None and e["segment"] in lost:
            # Its rows of the state file are skipped: the blocks after it read theirs.
            at_rep += bool(e["rep"])
            at_layer = [at + int(kept or 0) for at, kept in zip(at_layer, layer_tokens[i])]
            continue
        if stored is not None:
            seg = stored.get(e["segment"])
            if seg is None or block_id not in seg:
                raise ValueError(f"block {block_id}: its segment {e['segment']!r} does not hold it")
            mine = seg[block_id]
            if tuple(mine.positions.shape) != (P, t):
                raise ValueError(f"block {block_id}: {t} tokens in the manifest, {mine.positions.shape[1]} in its segment")
        kvs: list[dict | None] = []
        for l, kept in enumerate(layer_tokens[i]):
            if kept is None:
                kvs.append(None)
                continue
            index, logical, keys, values = layers[l]
            sl = slice(at_layer[l], at_layer[l] + int(kept))
            at_layer[l] += int(kept)
            idx = index[sl].clone()
            if stored is None:
                k, v = keys[:, sl], values[:, sl]  # (H, kept, D)
            else:
                k, v = _gather_stored(block_id, l, mine.layers[l], idx)
            kvs.append({"index": idx, "logical": logical[:, sl].clone(), "keys": k, "values": v})
        rep = None
        if e["rep"]:
            if reps is None:  # refused above (n_reps > 0 here): the check for mypy
                raise ValueError(f"block {block_id} has a representative, the state holds none")
            rep = reps[at_rep].clone()
            at_rep += 1
        blocks.append({
            "id": block_id, "camera": str(e["camera"]), "stamp_ns": int(e["stamp_ns"]),
            "stamps_ns": [int(s) for s in e["stamps_ns"]], "kind": str(e["kind"]), "stream": str(e["stream"]),
            "rank": int(e["rank"]), "protected": bool(e["protected"]), "tier": e["tier"], "revision": int(e.get("revision", 0)),
            "poses": _poses(e), **_span(e), "words": _words(e.get("words", []), f"block {e['id']}"),
            "positions": (positions[:, at_pos : at_pos + t] if stored is None else mine.positions).clone(),
            "key_mean": (key_mean[i] if stored is None else mine.key_mean).clone(),
            "rep": rep, "layers": kvs,
        })
        at_pos += t
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


def _words(words, where: str) -> tuple[str, ...]:
    """A block's or a pending frame's words (``FrameBlock.words``): a list of non-empty strings, each once; none
    before 2026-11-27."""
    if not isinstance(words, list) or not all(isinstance(w, str) and w.strip() for w in words) or len(set(words)) != len(words):
        raise ValueError(f"{where}: words must be a list of distinct non-empty strings, got {words!r}")
    return tuple(words)


def _poses(entry: dict) -> tuple:
    """A block entry's poses, aligned with its stamps (or none at all); none before version 3."""
    poses = entry.get("poses")
    if not poses:  # versions 1 and 2, or a block a policy made itself (no frame, no pose)
        return ()
    if len(poses) != len(entry["stamps_ns"]):
        raise ValueError(f"block {entry['id']}: {len(poses)} poses for {len(entry['stamps_ns'])} stamps")
    return tuple(None if p is None else Pose.from_dict(p) for p in poses)


def _span(entry: dict) -> dict:
    """A block entry's still span as ``FrameBlock.from_state_dict`` reads it; none before version 4."""
    span = entry.get("span")
    if not span:
        return {}
    end, merged, pose = span
    if int(end) < int(entry["stamp_ns"]) or int(merged) < 1:
        raise ValueError(f"block {entry['id']}: a span must end after its stamp and merge frames, got {span}")
    return {"span_end_ns": int(end), "frames_merged": int(merged), "span_end_pose": None if pose is None else Pose.from_dict(pose)}


def _expect(tensors: dict[str, torch.Tensor], name: str, shape: tuple[int, ...], dtype: torch.dtype, where: str = "") -> torch.Tensor:
    t = tensors[name]
    if tuple(t.shape) != shape or t.dtype != dtype:
        raise ValueError(f"{where + ': ' if where else ''}{name} is {tuple(t.shape)} {dtype_name(t.dtype)}, "
                         f"the manifest needs {shape} {dtype_name(dtype)}")
    return t
