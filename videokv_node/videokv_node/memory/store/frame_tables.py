"""The poses and words of frames by (camera, stamp): what a block gets when it is made or stored.

A policy may build a block from frames received earlier (StreamKV's segments, MuKV's), so the engine keeps
each frame's pose (``Frame.pose`` at ingest) and words (``VideoLLMAdapter.frame_words`` of the encoded frame)
until no block cites it and none may: the tables are pruned after evictions to the frames still in memory or
waiting. Blocks keep their own copy (``FrameBlock.poses``, ``words``): the evidence, ``~/locate`` and
snapshots read that, never these tables.
"""

from __future__ import annotations

from collections.abc import Iterable

from videokv_node.memory.store.block import FrameBlock
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.pose import Pose

FrameKey = tuple[str, int]  # (camera, header stamp in ns)


class FrameTables:
    """Per frame, its pose and its words (the engine's thread only).

    Guarantees: a frame's entries stay while a block in the store cites it, while it is pending (a policy's
    open segment) or while it is newer than every block of its camera; ``prune`` drops the rest, scanning
    memory only after evictions (O(1) otherwise)."""

    def __init__(self) -> None:
        self.poses: dict[FrameKey, Pose] = {}  # changed by note, prune, restore and clear only
        self.words: dict[FrameKey, tuple[str, ...]] = {}  # likewise
        self._pruned_at = -1  # store.evicted_blocks when last pruned

    def note(self, keys: Iterable[FrameKey], poses: Iterable[Pose | None], words: Iterable[tuple[str, ...]]) -> None:
        """Remember the poses and words of frames about to be encoded (None or empty: nothing to remember)."""
        for key, pose, said in zip(keys, poses, words):
            if pose is not None:
                self.poses[key] = pose
            if said:
                self.words[key] = said

    def words_of(self, block: FrameBlock) -> tuple[str, ...]:
        """The words of the frames ``block`` stands for (``FrameBlock.words``): each once, in stamp order."""
        return tuple(dict.fromkeys(w for s in block.stamps_ns for w in self.words.get((block.camera, s), ())))

    def pending_poses(self, store: BlockStore) -> dict[FrameKey, Pose]:
        """Poses of frames received but cited by no block yet (an open segment, MuKV's partial one)."""
        cited = {(b.camera, s) for b in store.blocks() for s in b.stamps_ns}
        return {k: p for k, p in self.poses.items() if k not in cited}

    def pending_words(self, store: BlockStore) -> dict[FrameKey, tuple[str, ...]]:
        """Words of frames received but cited by no block yet (as ``pending_poses``)."""
        cited = {(b.camera, s) for b in store.blocks() for s in b.stamps_ns}
        return {k: w for k, w in self.words.items() if k not in cited}

    def stale(self, store: BlockStore) -> bool:
        """Whether ``prune`` has anything to scan: entries held and evictions since the last prune."""
        return bool(self.poses or self.words) and store.evicted_blocks != self._pruned_at

    def prune(self, store: BlockStore, pending: Iterable[FrameKey]) -> None:
        """Forget the frames neither ``pending`` nor cited by a block in ``store`` (evicted ones).

        A received frame is pending, cited by a block or newer than every block's frames (waiting in a
        policy's state), and only leaves memory by an eviction (counted), so the tables are scanned only
        after evictions. The caller holds the store's lock if another thread may read it."""
        if not self.stale(store):
            return
        self._pruned_at = store.evicted_blocks
        live = set(pending)
        newest: dict[str, int] = {}  # per camera, the newest stamp a block cites
        for b in store.blocks():
            live.update((b.camera, s) for s in b.stamps_ns)
            newest[b.camera] = max(newest.get(b.camera, -1), *b.stamps_ns)
        # Frames newer than any block's may wait in a policy's own state (MuKV's partial segment
        # when it keeps no frame blocks) without being pending units: kept.
        self.poses = {(c, s): p for (c, s), p in self.poses.items() if (c, s) in live or s > newest.get(c, -1)}
        self.words = {(c, s): w for (c, s), w in self.words.items() if (c, s) in live or s > newest.get(c, -1)}

    def restore(self, blocks: list[FrameBlock], pending_poses: dict[FrameKey, Pose],
                pending_words: dict[FrameKey, tuple[str, ...]]) -> None:
        """The tables of a restored state: the blocks' poses and ``pending_poses``; the words of one-frame
        blocks (a policy may build a summary of frames stored already) and ``pending_words``. Scans once
        at the next ``prune`` (the restore may have evicted)."""
        self.poses = dict(pending_poses)
        self.poses.update(((b.camera, s), p) for b in blocks for s, p in zip(b.stamps_ns, b.poses) if p is not None)
        self.words = {(b.camera, b.stamp_ns): b.words for b in blocks if b.words and len(b.stamps_ns) == 1}
        self.words.update(pending_words)
        self._pruned_at = -1

    def clear(self) -> None:
        """Forget every frame (a memory reset)."""
        self.poses, self.words = {}, {}
