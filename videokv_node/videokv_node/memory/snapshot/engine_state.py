"""The engine's state out and in, the ``state_dict`` way: what a restart must get back.

A mixin of ``VideoMemoryEngine``, with the tables of frame poses and words it keeps. The engine's state is its
counters, the poses and words of frames no block cites yet, the block store's state (``BlockStore.state_dict``: every block and its
K/V) and the policy's (``MemoryPolicy.state_dict``). What the engine derives from the
config and the model (the prompt sink, the policy's guidance) is rebuilt, never saved;
``identity`` says what a saved state must match. ``memory/snapshot/format.py`` writes a state to
disk and reads it back; nothing here knows about files.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection

from videokv_node.memory.records.state import PolicyStateError, dtype_name, reason
from videokv_node.memory.store.block import FrameBlock
from videokv_node.pose import Pose


class EngineStateMixin:
    """``identity``, ``state_dict``, ``load_state_dict`` and the frame tables for ``VideoMemoryEngine``
    (the engine's thread).

    The frame tables, by (camera, stamp): ``_frame_poses`` (from ``Frame.pose`` at ingest) and ``_frame_words``
    (``VideoLLMAdapter.frame_words`` of the encoded frame). Read when a block is made or stored (a policy may
    build a block from frames received earlier: StreamKV's segments, MuKV's), pruned after evictions to the
    frames still in memory or waiting (``_prune_frame_tables``). Blocks keep their own copy (``FrameBlock.poses``,
    ``words``): the evidence, ``~/locate`` and snapshots read that."""

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

    def pending_words(self) -> dict[tuple[str, int], tuple[str, ...]]:
        """Words of frames received but cited by no block yet (as ``pending_poses``); the state keeps them."""
        cited = {(b.camera, s) for b in self.store.blocks() for s in b.stamps_ns}
        return {k: w for k, w in self._frame_words.items() if k not in cited}

    def words_of(self, block: FrameBlock) -> tuple[str, ...]:
        """The words of the frames ``block`` stands for (``FrameBlock.words``): each once, in stamp order."""
        return tuple(dict.fromkeys(w for s in block.stamps_ns for w in self._frame_words.get((block.camera, s), ())))

    def _prune_frame_tables(self) -> None:
        """Forget the poses and words of frames neither pending nor cited by a block in memory (evicted ones).

        A received frame is pending, cited by a block or newer than every block's frames (waiting
        in a policy's state), and only leaves memory by an eviction (counted), so the table is
        scanned only after evictions: O(blocks) then, O(1) otherwise.
        """
        if not (self._frame_poses or self._frame_words) or self.store.evicted_blocks == self._tables_pruned_at:
            return
        self._tables_pruned_at = self.store.evicted_blocks
        live = {(u.camera, s) for u in self.policy.pending_units() for s in (u.stamps_ns or (u.stamp_ns,))}
        newest: dict[str, int] = {}  # per camera, the newest stamp a block cites
        with self._lock:
            for b in self.store.blocks():
                live.update((b.camera, s) for s in b.stamps_ns)
                newest[b.camera] = max(newest.get(b.camera, -1), *b.stamps_ns)
        # Frames newer than any block's may wait in a policy's own state (MuKV's partial segment
        # when it keeps no frame blocks) without being pending units: kept.
        self._frame_poses = {(c, s): p for (c, s), p in self._frame_poses.items() if (c, s) in live or s > newest.get(c, -1)}
        self._frame_words = {(c, s): w for (c, s), w in self._frame_words.items() if (c, s) in live or s > newest.get(c, -1)}

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

        ``{"next_block_id", "frames_ingested", "pending_poses": {(camera, stamp): Pose}, "pending_words":
        {(camera, stamp): words},
        "store": BlockStore.state_dict(kv_for), "policy": MemoryPolicy.state_dict(), "config":
        the memory config as a dict (for people; ``load_state_dict`` ignores it)}``.
        """
        return {
            "next_block_id": self._next_block_id,
            "frames_ingested": self._ingested,
            "pending_poses": self.pending_poses(),
            "pending_words": self.pending_words(),
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
        and ``pending_poses``, the words table from ``pending_words``. Nothing there is expected to fail; should it (a bug, host memory
        exhausted), the memory is left empty rather than half restored.
        """
        store_state = state["store"]
        blocks = [FrameBlock.from_state_dict(s, self.store.device) for s in store_state["blocks"]]
        next_block_id, frames_ingested = int(state["next_block_id"]), int(state["frames_ingested"])
        pending_poses = dict(state["pending_poses"])
        pending_words = dict(state.get("pending_words", {}))  # none in a state from before 2026-11-27
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
            # A one-frame block's words are its frame's (a policy may build a summary of frames stored already).
            self._frame_words = {(b.camera, b.stamp_ns): b.words for b in blocks if b.words and len(b.stamps_ns) == 1}
            self._frame_words.update(pending_words)
            self._tables_pruned_at = -1  # the restore may have evicted: scan once
            self._prune_frame_tables()
        except BaseException:
            with self._lock:
                self.store.clear()
                self.policy.reset()
            self._frame_poses, self._frame_words = {}, {}
            raise
        finally:
            if self.resident is not None:
                self.resident.clear()
                self._place_resident()
            self._ingest_ms.clear()
            self.last_layer_blocks, self.last_layer_token_share, self._context_len, self.last_logits = [], [], 0, None
            self._stats = self._snapshot()
