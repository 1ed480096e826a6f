"""Still frames cost nothing (issue 36, ours): a frame that shows what its camera's last stored frame
showed is not encoded; the stored frame's block(s) stand for a longer span instead.

Anchors (docs/POLICIES.md, "Still frames"): FluxMem drops tokens repeated from the previous frame,
STC reuses the vision features of similar frames, CacheFlow stores fewer tokens for redundant
frames. Ours is the frame-level form, decided before the vision encoder so a still frame costs
neither the encoder nor the decoder's prefill nor any KV:

- **The test** (``is_still``): each frame's grey thumbnail (an exact area mean over a grid of at
  most ``grid`` x ``grid`` cells, every pixel in one cell) against the camera's **last stored**
  frame's. Still when no cell moved more than ``max_cell_diff`` grey levels and the cells' mean
  absolute change is at most ``max_mean_diff``. The area mean is what makes it noise-aware:
  independent sensor noise of sigma grey levels shrinks to sigma / sqrt(3 x pixels per cell) in a
  cell (640 x 480 on a 32-grid: 300 pixels, sigma 4 -> 0.13), while a thing covering part of one
  cell moves that cell by its contrast times its share. Text frames (text LMs) are still when
  their text is equal.
- **Against the stored frame, not the last seen**: a slow drift (light, a creeping pan) adds up
  against a fixed reference until the test fails and a new frame is stored, so no span merges
  forever. A thing seen for 1-3 frames differs from the stored view: its frames are stored as
  their own blocks, and the view after it differs from the thing's frame, so it is stored anew too
  (a needle or a revisit is never merged into another view).
- **The span**: every block whose newest stamp is the stored frame's (the frame block; a MuKV
  segment or StreamKV summary ending on it) gets ``span_end_ns`` (the last merged frame's stamp),
  ``frames_merged`` and ``span_end_pose`` (``FrameBlock``). Merged frames are never handed to the
  policy: StreamKV's segmenter, HERMES' chunks and MuKV's segments count stored frames only.
- **Only while the stored frame is in memory**: once every block of it has been evicted, the next
  frame is stored, whatever it shows (memory keeps the view that is in front of the camera now).

Not done, and why: no feature-level second test (the encoder's features are what a still frame
skips; a feature test would cost the encoder call it saves), and no token-level merging
(FluxMem's changed tokens only): the hour's still shots differ by noise only, so whole frames
merge, and a moving frame changes nearly every token; a block of some tokens would also break the
one-block-per-frame retrieval and RoPE layout every policy relies on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from videokv_node.memory.records.still_config import RedundancyConfig

if TYPE_CHECKING:
    from videokv_node.memory.store.block import FrameBlock
    from videokv_node.memory.question import Frame
    from videokv_node.pose import Pose


def thumbnail(rgb, grid: int) -> np.ndarray | str:
    """(gh, gw) float32 grey area means of an (H, W, 3) uint8 frame, every pixel in exactly one cell
    (cells differ by at most one row or column); a text frame is its own thumbnail."""
    if isinstance(rgb, str):
        return rgb
    img = np.asarray(rgb)
    if img.ndim != 3 or img.shape[2] != 3:
        raise ValueError(f"a still-frame thumbnail needs an (H, W, 3) frame, got shape {img.shape}")
    h, w = img.shape[:2]
    rows = np.linspace(0, h, min(grid, h) + 1).astype(np.int64)  # cell edges, every pixel in one cell
    cols = np.linspace(0, w, min(grid, w) + 1).astype(np.int64)
    grey = img.sum(axis=2, dtype=np.float32)  # (H, W), 3x grey
    sums = np.add.reduceat(np.add.reduceat(grey, rows[:-1], axis=0), cols[:-1], axis=1)  # (gh, gw)
    counts = np.outer(np.diff(rows), np.diff(cols)) * 3
    return sums / counts


def is_still(thumb, ref, config: RedundancyConfig) -> bool:
    """True when ``thumb`` shows what ``ref`` showed, as the module doc says."""
    if isinstance(thumb, str) or isinstance(ref, str):
        return thumb == ref
    if thumb.shape != ref.shape:
        return False
    diff = np.abs(thumb - ref)
    return float(diff.max()) <= config.max_cell_diff and float(diff.mean()) <= config.max_mean_diff


@dataclass(slots=True)
class _Stored:
    """A stored frame of one camera: its thumbnail, the blocks made of it so far, what merged into it."""

    camera: str
    stamp_ns: int
    thumb: np.ndarray | str
    blocks: list[FrameBlock] = field(default_factory=list)
    span_end_ns: int = 0  # 0: nothing merged yet
    merged: int = 0
    end_pose: Pose | None = None


class StillFilter:
    """Per camera, the last stored frame and the frames merged into it (the engine's thread only).

    Guarantees: a frame is merged only into its own camera's last stored frame, only while a block of
    that frame is in memory (``held``) or none has been made yet (it waits in a policy's open
    segment), and ``frames_merged`` counts every frame merged since start (a reset keeps it).
    """

    # Stored frames with no block yet (StreamKV's open segment) kept for their blocks to come; more than
    # this many per filter means a policy never made blocks of them, and the oldest are forgotten.
    MAX_WAITING = 1024

    def __init__(self, config: RedundancyConfig, frames_merged: int = 0) -> None:
        self.config = config
        self._last: dict[str, _Stored] = {}  # per camera, its last stored frame
        self._by_stamp: dict[tuple[str, int], _Stored] = {}  # stored frames whose blocks may still come
        self.frames_merged = frames_merged  # since start, across resets (a reset makes a new filter with it)

    def split(self, frames: Iterable[Frame], held: Callable[[FrameBlock], bool]) -> tuple[list[Frame], list[_Stored]]:
        """The frames to encode (time order kept) and the stored frames whose spans grew."""
        kept: list[Frame] = []
        grown: list[_Stored] = []
        for frame in frames:
            thumb = thumbnail(frame.rgb, self.config.grid)
            last = self._last.get(frame.camera)
            alive = last is not None and (not last.blocks or any(held(b) for b in last.blocks))
            if alive and last is not None and is_still(thumb, last.thumb, self.config):
                last.span_end_ns, last.merged, last.end_pose = frame.stamp_ns, last.merged + 1, frame.pose
                self.frames_merged += 1
                if not grown or grown[-1] is not last:
                    grown.append(last)
                continue
            stored = _Stored(frame.camera, frame.stamp_ns, thumb)
            self._last[frame.camera] = self._by_stamp[(frame.camera, frame.stamp_ns)] = stored
            kept.append(frame)
        return kept, grown

    def made(self, blocks: Iterable[FrameBlock]) -> list[_Stored]:
        """Note new blocks: each whose newest stamp is a stored frame's joins it; returns the stored
        frames with a span that gained blocks. Stored frames no longer last that have blocks are let go."""
        gained: list[_Stored] = []
        for block in blocks:
            stored = self._by_stamp.get((block.camera, max(block.stamps_ns)))
            if stored is not None and block.cited_stamps:
                stored.blocks.append(block)
                if stored.merged and (not gained or gained[-1] is not stored):
                    gained.append(stored)
        last = {id(s) for s in self._last.values()}
        self._by_stamp = {k: s for k, s in self._by_stamp.items() if id(s) in last or not s.blocks}
        while len(self._by_stamp) > self.MAX_WAITING:
            del self._by_stamp[next(iter(self._by_stamp))]
        return gained


def span_of(stored: _Stored) -> tuple[int, int, Pose | None]:
    """(last stamp, frames merged, pose at the last stamp) of a stored frame's span."""
    return stored.span_end_ns, stored.merged, stored.end_pose
