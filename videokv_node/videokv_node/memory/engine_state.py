"""The engine's state out and in, the ``state_dict`` way: what a restart must get back.

A mixin of ``VideoMemoryEngine``, with the table of frame poses it keeps (``_prune_poses``). The engine's state is its counters, the poses of frames no
block cites yet, the block store's state (``BlockStore.state_dict``: every block and its
K/V) and the policy's (``MemoryPolicy.state_dict``). What the engine derives from the
config and the model (the prompt sink, the policy's guidance) is rebuilt, never saved;
``identity`` says what a saved state must match. ``memory/snapshot/format.py`` writes a state to
disk and reads it back; nothing here knows about files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection

from videokv_node.memory.state import PolicyStateError, dtype_name, reason
from videokv_node.memory.store.block import FrameBlock
from videokv_node.pose import Pose


class EngineStateMixin:
    """``identity``, ``state_dict``, ``load_state_dict`` and the pose table for ``VideoMemoryEngine``
    (the engine's thread)."""

    @property
    def next_block_id(self) -> int:
        """The id the next block will get (ids only increase, across restarts too)."""
        return self._next_block_id

    @property
    def frames_ingested(self) -> int:
        return self._ingested

    def pending_poses(self) -> dict[tuple[str, int], Pose]:
        """Poses of frames received but cited by no block yet (an open segment, MuKV's partial one);
        the state keeps them."""
        cited = {(b.camera, s) for b in self.store.blocks() for s in b.stamps_ns}
        return {k: p for k, p in self._frame_poses.items() if k not in cited}

    def _prune_poses(self) -> None:
        """Forget the poses of frames neither pending nor cited by a block in memory (evicted ones).

        A received frame is pending, cited by a block or newer than every block's frames (waiting
        in a policy's state), and only leaves memory by an eviction (counted), so the table is
        scanned only after evictions: O(blocks) then, O(1) otherwise.
        """
        if not self._frame_poses or self.store.evicted_blocks == self._poses_pruned_at:
            return
        self._poses_pruned_at = self.store.evicted_blocks
        live = {(u.camera, s) for u in self.policy.pending_units() for s in (u.stamps_ns or (u.stamp_ns,))}
        newest: dict[str, int] = {}  # per camera, the newest stamp a block cites
        with self._lock:
            for b in self.store.blocks():
                live.update((b.camera, s) for s in b.stamps_ns)
                newest[b.camera] = max(newest.get(b.camera, -1), *b.stamps_ns)
        # Frames newer than any block's may wait in a policy's own state (MuKV's partial segment
        # when it keeps no frame blocks) without being pending units: kept.
        self._frame_poses = {(c, s): p for (c, s), p in self._frame_poses.items() if (c, s) in live or s > newest.get(c, -1)}

    def identity(self) -> dict:
        """What a saved state must match to be loaded here: the model (name, fingerprint, tokens per
        frame, position dims, KV geometry, the prompt sink's token ids) and the policy's name."""
        adapter, geo = self.adapter, self.adapter.geometry
        model = {
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
        return {"model": model, "policy": self.policy.name}

    def state_dict(self, kv_for: Callable[[list[dict]], Collection[int]] | None = None) -> dict:
        """The whole memory, tensors by reference: copy them before the engine goes on.

        ``{"next_block_id", "frames_ingested", "pending_poses": {(camera, stamp): Pose},
        "store": BlockStore.state_dict(kv_for), "policy": MemoryPolicy.state_dict(), "config":
        the memory config as a dict (for people; ``load_state_dict`` ignores it)}``.
        """
        return {
            "next_block_id": self._next_block_id,
            "frames_ingested": self._ingested,
            "pending_poses": self.pending_poses(),
            "store": self.store.state_dict(kv_for),
            "policy": self.policy.state_dict(),
            "config": dataclasses.asdict(self.config),
        }

    def load_state_dict(self, state: dict) -> None:
        """Replace every block, the counters, the poses and the policy's state by ``state``'s.

        ``state["lost"]["blocks"]`` (optional): ids of blocks the state once held but could not
        give back (a snapshot's damaged segment). The policy's state is taken without them
        (``MemoryPolicy.without_blocks``), so nothing restored refers to a block that is not
        there; their frames are simply not in memory, as if evicted (not counted as evictions).

        Checked before anything changes: every block is built (``FrameBlock.from_state_dict``),
        the ids and counters must agree, and the policy validates its state (one that does not
        fit raises ``PolicyStateError``); a malformed state raises ValueError, KeyError,
        TypeError, IndexError or AttributeError. On any of these nothing changed. Then the
        memory is swapped and the current caps enforced as after an ingest: the policy's own
        (``after_restore``), then the resident budget and the host arena, the policy choosing
        the victims and every eviction counted. The pose table is rebuilt from the blocks' poses
        and ``pending_poses``. Nothing there is expected to fail; should it (a bug, host memory
        exhausted), the memory is left empty rather than half restored.
        """
        store_state = state["store"]
        blocks = [FrameBlock.from_state_dict(s, self.store.device) for s in store_state["blocks"]]
        next_block_id, frames_ingested = int(state["next_block_id"]), int(state["frames_ingested"])
        pending_poses = dict(state["pending_poses"])
        by_id = {b.block_id: s for b, s in zip(blocks, store_state["blocks"])}
        if by_id and next_block_id <= max(by_id):
            raise ValueError(f"next block id {next_block_id} is not after the last block {max(by_id)}")
        device = self.adapter.device
        policy_state = {"meta": state["policy"]["meta"], "tensors": {n: t.to(device) for n, t in state["policy"]["tensors"].items()}}
        lost = set(state.get("lost", {}).get("blocks", ()))
        if lost & set(by_id):
            raise ValueError(f"blocks {sorted(lost & set(by_id))} are both restored and lost")
        if lost:
            policy_state = self.policy.without_blocks(policy_state, lost)
        try:
            self.policy.load_state_dict(policy_state, by_id)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise PolicyStateError(f"the {self.policy.name} policy's state does not fit: {reason(exc)}") from exc
        try:
            with self._lock:
                self.store.load_state_dict({**store_state, "blocks": blocks}, self.policy.offload_victim)
                self._next_block_id, self._ingested = next_block_id, frames_ingested
                self.policy.after_restore(self.store)
                self._enforce_caps()
            self._frame_poses = pending_poses
            self._frame_poses.update(((b.camera, s), p) for b in blocks for s, p in zip(b.stamps_ns, b.poses) if p is not None)
            self._poses_pruned_at = -1  # the restore may have evicted: scan once
            self._prune_poses()
        except BaseException:
            with self._lock:
                self.store.clear()
                self.policy.reset()
            self._frame_poses = {}
            raise
        finally:
            if self.resident is not None:
                self.resident.clear()
                self._place_resident()
            self._ingest_ms.clear()
            self.last_layer_blocks, self.last_layer_token_share, self._context_len, self.last_logits = [], [], 0, None
            self._stats = self._snapshot()
