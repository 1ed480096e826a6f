"""The memory read as plain records (``MemoryView``): what the markers and the contact sheet are drawn from.

``read_view`` is the one place that reads the block store; the node runs it on the model worker (a
read-only job, between two frames, that takes no planner's slot: ``ModelWorker.peek``), since only that thread
touches the engine. It copies a few numbers and references per block (no tensor is read), so it
costs microseconds a block; everything drawn from the view is built afterwards, off the worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from videokv_node.memory.store.block import FrameBlock, Tier
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.pose import Pose

RESIDENT, OFFLOADED = Tier.RESIDENT.value, Tier.OFFLOADED.value


@dataclass(frozen=True, slots=True)
class FrameView:
    """One block of the memory as drawn: immutable, so a view may be compared with the last one drawn."""

    block_id: int  # the block's id: strictly increasing in creation order, never reused (markers' stable ids)
    camera: str  # the camera's topic
    stamps_ns: tuple[int, ...]  # every frame it stands for, ascending
    poses: tuple[Pose | None, ...]  # the robot's pose at each of stamps_ns, None where unknown
    tier: str  # RESIDENT (K/V on the model's device) or OFFLOADED (host arena)
    words: tuple[str, ...] = ()  # the words the model wrote into its frames (videokv-tiny's nouns)
    span_end_ns: int = 0  # a still span's last merged frame (0: none merged)
    span_end_pose: Pose | None = None  # the robot's pose at span_end_ns, if known
    frames_merged: int = 0  # frames merged into its still span

    @property
    def stamp_ns(self) -> int:
        """Its first frame's stamp."""
        return self.stamps_ns[0]

    @property
    def newest_ns(self) -> int:
        """The last frame it stands for: its still span's end, else its newest stamp."""
        return max(self.span_end_ns, self.stamps_ns[-1])

    @property
    def pose(self) -> Pose | None:
        """The pose it was seen from: at its first stamp that has one."""
        return next((p for p in self.poses if p is not None), None)


@dataclass(frozen=True, slots=True)
class MemoryView:
    """The blocks in memory that cite frames, in time order (first stamp, then id)."""

    frames: tuple[FrameView, ...] = ()

    @property
    def span_ns(self) -> tuple[int, int]:
        """(oldest, newest) stamp held; (0, 0) for an empty memory."""
        if not self.frames:
            return 0, 0
        return min(f.stamp_ns for f in self.frames), max(f.newest_ns for f in self.frames)


def frame_view(block: FrameBlock) -> FrameView | None:
    """The record of one block; None for a block that cites no frame (HERMES' summary token of the distant past)."""
    stamps = block.cited_stamps
    if not stamps:
        return None
    order = sorted(range(len(stamps)), key=lambda i: stamps[i])
    poses = block.poses if len(block.poses) == len(stamps) else (None,) * len(stamps)
    return FrameView(block.block_id, block.camera, tuple(stamps[i] for i in order), tuple(poses[i] for i in order),
                     block.tier.value, tuple(block.words), block.span_end_ns, block.span_end_pose, block.frames_merged)


def read_view(store: BlockStore) -> MemoryView:
    """The memory's blocks as a view; call it only where the engine may be read (its model worker)."""
    frames = [v for v in map(frame_view, store.blocks()) if v is not None]
    frames.sort(key=lambda f: (f.stamp_ns, f.block_id))
    return MemoryView(tuple(frames))
