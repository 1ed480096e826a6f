"""A memory's state dict packed into a snapshot's files (the format: ``format.py``'s docstring).

Pure functions from an engine's ``state_dict`` (``engine_state.py``) to the manifest's
entries and the state and segment files' tensors, and the plan of what an incremental
snapshot links from its base. Host copies throughout: what they return shares no memory with
the engine, which may go on while it is written.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from videokv_node.memory.snapshot.files import MANIFEST
from videokv_node.memory.records.state import dtype_from_name, host_copy

# Version 3 (issue 17) adds each block's ``poses`` (aligned with ``stamps_ns``, null where
# unknown) and the engine's ``pending_poses``; it is version 2 otherwise. Versions 1 and 2 load
# with no poses. Version 4 (issue 36) adds a block's still span, ``span``: [last stamp, frames
# merged, pose there or null], on blocks that have one; versions 1-3 load with no spans.
SNAPSHOT_VERSION = 4
READABLE_VERSIONS = (1, 2, 3, 4)
SEGMENTED_VERSIONS = (2, 3, 4)  # stored as segments + state file (version 1: one kv.safetensors)
FORMAT = "videokv-memory-snapshot"
STATE = "state.safetensors"
TENSORS_V1 = "kv.safetensors"
COMPACT_BELOW = 0.5  # a base segment with fewer live entries than this share of its own is rewritten, not linked


def base_index(fingerprint: str, base: Path | None) -> tuple[dict[int, tuple[str, int]], dict[str, dict]]:
    """block id -> (segment, revision) and segment name -> record of a usable base snapshot, else empty."""
    if base is None:
        return {}, {}
    try:
        manifest = json.loads((Path(base) / MANIFEST).read_text())
        # Versions 2-4 share the segment layout (3 adds poses, 4 spans: both live in the manifest, rewritten each time).
        if manifest.get("version") not in SEGMENTED_VERSIONS or manifest.get("model", {}).get("fingerprint") != fingerprint:
            return {}, {}
        segments = {name: rec for name, rec in manifest["segments"].items() if (Path(base) / name).is_file()}
        blocks = {int(e["id"]): (e["segment"], int(e["revision"])) for e in manifest["blocks"] if e["segment"] in segments}
        return blocks, segments
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}, {}


def plan_links(blocks: list[dict], base_blocks: dict[int, tuple[str, int]],
               base_segments: dict[str, dict]) -> tuple[dict[int, str], dict[str, dict]]:
    """(block id -> base segment it is read from, base segment name -> record to link) for the
    block states ``blocks``: a block the base stores at its current revision is not written
    again, unless its segment's live entries fell below ``COMPACT_BELOW`` of what it stores."""
    reuse: dict[int, str] = {}
    live: dict[str, int] = {}
    for b in blocks:
        seg = base_blocks.get(b["id"])
        if seg is not None and seg[1] == b["revision"]:
            reuse[b["id"]] = seg[0]
            live[seg[0]] = live.get(seg[0], 0) + entries(b)
    linked = {name: base_segments[name] for name, n in live.items() if n >= COMPACT_BELOW * int(base_segments[name]["entries"])}
    return {i: s for i, s in reuse.items() if s in linked}, linked


def entries(block: dict) -> int:
    """Kept (token, layer) entries of a block state."""
    return sum(int(kv["index"].numel()) for kv in block["layers"] if kv is not None)


def block_entry(b: dict, segment: str | None) -> dict:
    """A block's manifest entry: what it is, the tokens each layer keeps, the segment holding its K/V."""
    return {
        "id": b["id"], "camera": b["camera"], "stamp_ns": b["stamp_ns"], "stamps_ns": list(b["stamps_ns"]),
        "kind": b["kind"], "stream": b["stream"], "rank": b["rank"], "protected": b["protected"], "tier": b["tier"],
        "n_tokens": int(b["positions"].shape[1]),
        "layer_tokens": [None if kv is None else int(kv["index"].numel()) for kv in b["layers"]],
        "rep": b["rep"] is not None, "revision": b["revision"], "segment": segment,
        "poses": [None if p is None else p.as_dict() for p in b["poses"]],
        **({"span": [b["span_end_ns"], b["frames_merged"], None if b["span_end_pose"] is None else b["span_end_pose"].as_dict()]}
           if b.get("span_end_ns") else {}),
        **({"words": list(b["words"])} if b.get("words") else {}),  # optional: absent where none (and before 2026-11-27)
    }


def state_tensors(blocks: list[dict], n_layers: int, position_dims: int, policy: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state file: per layer the kept indices and logical positions now, block after block,
    the representatives of the blocks that have one, and the policy's tensors under ``policy/``."""
    per_layer: list[dict[str, list[torch.Tensor]]] = [{"index": [], "logical": []} for _ in range(n_layers)]
    reps = []
    for b in blocks:
        for layer, kv in enumerate(b["layers"]):
            if kv is not None:
                per_layer[layer]["index"].append(kv["index"].cpu())
                per_layer[layer]["logical"].append(kv["logical"].cpu())
        if b["rep"] is not None:
            reps.append(b["rep"].cpu())
    state: dict[str, torch.Tensor] = {}
    for layer, parts in enumerate(per_layer):
        state[f"layers/{layer}/index"] = torch.cat(parts["index"]) if parts["index"] else torch.zeros(0, dtype=torch.long)
        state[f"layers/{layer}/logical"] = (torch.cat(parts["logical"], dim=1) if parts["logical"]
                                            else torch.zeros(position_dims, 0, dtype=torch.long))
    if reps:
        state["blocks/rep"] = torch.stack(reps)
    for name, t in policy.items():
        state[f"policy/{name}"] = host_copy(t)
    return state


def segment_tensors(blocks: list[dict], geometry: dict) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The immutable part of block states that carry their K/V, as one segment's tensors (host
    copies) and its metadata (the block list and the entries it stores)."""
    H, D, dtype = geometry["n_kv_heads"], geometry["head_dim"], dtype_from_name(geometry["dtype"])
    per_layer: list[dict[str, list[torch.Tensor]]] = [{"index": [], "keys": [], "values": []} for _ in range(geometry["n_layers"])]
    listing, n_entries = [], 0
    for b in blocks:
        for layer, kv in enumerate(b["layers"]):
            if kv is None:
                continue
            per_layer[layer]["index"].append(kv["index"].cpu())
            per_layer[layer]["keys"].append(kv["keys"].cpu())  # (H, t, D)
            per_layer[layer]["values"].append(kv["values"].cpu())
        listing.append([b["id"], int(b["positions"].shape[1]), [None if kv is None else int(kv["index"].numel()) for kv in b["layers"]]])
        n_entries += entries(b)
    tensors = {
        "blocks/positions": torch.cat([b["positions"].cpu() for b in blocks], dim=1),  # (P, sum T)
        "blocks/key_mean": torch.stack([b["key_mean"].cpu() for b in blocks]),  # (B, L, H, D)
    }
    for layer, parts in enumerate(per_layer):
        if parts["index"]:
            tensors[f"layers/{layer}/index"] = torch.cat(parts["index"])
            tensors[f"layers/{layer}/keys"] = torch.cat(parts["keys"], dim=1)  # (H, S_l, D)
            tensors[f"layers/{layer}/values"] = torch.cat(parts["values"], dim=1)
        else:
            tensors[f"layers/{layer}/index"] = torch.zeros(0, dtype=torch.long)
            tensors[f"layers/{layer}/keys"] = torch.zeros(H, 0, D, dtype=dtype)
            tensors[f"layers/{layer}/values"] = torch.zeros(H, 0, D, dtype=dtype)
    return tensors, {"blocks": json.dumps(listing), "entries": str(n_entries)}


def manifest(identity: dict, state: dict, blocks: list[dict]) -> dict:
    """The manifest without its files' records (``PreparedSnapshot.write`` adds them)."""
    store = state["store"]
    return {
        "format": FORMAT,
        "version": SNAPSHOT_VERSION,
        "model": identity["model"],
        "policy": identity["policy"],
        "config": state["config"],  # what it was saved under (for people; not checked)
        "engine": {
            "next_block_id": state["next_block_id"],
            "frames_ingested": state["frames_ingested"],
            "evicted_blocks": store["evicted_blocks"],
            "evicted_entries": store["evicted_entries"],
            "pending_poses": [[c, s, p.as_dict()] for (c, s), p in sorted(state["pending_poses"].items())],
            "pending_words": [[c, s, list(w)] for (c, s), w in sorted(state.get("pending_words", {}).items())],
        },
        "blocks": blocks,
        "policy_state": state["policy"]["meta"],
    }
