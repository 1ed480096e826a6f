"""The long-replay frame archive: sampled frames kept as JPEG in RAM, capped in bytes.

The node keeps the frames it sampled into memory here so that a question reaching back before
its oldest memory can be sent, with its frames, to the Spava long-replay service
(``ros/long_replay_client.py`` forwards; this module only holds). A cap in bytes
(``spava.archive_bytes``), not frames, because a JPEG's size follows the camera's resolution and
the scene; ``~/memory_stats`` reports ``bytes`` as ``spava_archive_bytes``. No ROS here, so the
cap is tested without a DDS domain (tests/unit/test_frame_archive.py).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import numpy as np

from videokv_node.ingest.image_decode import decode_compressed_image, encode_compressed_image
from videokv_node.pose import Pose


@dataclass(slots=True)
class _Archived:
    camera: str
    stamp_ns: int
    jpeg: bytes
    pose: Pose | None = None  # the robot's pose at the frame (pose_topic), sent with it; set_pose may replace it


class FrameArchive:
    """Sampled frames as JPEG, at most ``capacity_bytes`` of them, oldest dropped first; thread-safe.

    Invariants, after every ``add``: ``bytes`` equals the sum of the JPEGs held and never exceeds
    ``capacity_bytes``; the frames held are the newest added (in the order added) that fit, since
    room is made by dropping the oldest first. A frame whose JPEG alone exceeds the whole cap is
    not kept and drops nothing (counted in ``too_large``); ``capacity_bytes`` 0 keeps nothing.
    """

    def __init__(self, capacity_bytes: int, quality: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes  # set once (spava.archive_bytes)
        self._frames: deque[_Archived] = deque()  # oldest added first
        self._by_stamp: dict[int, list[_Archived]] = {}  # the frames held, by stamp: set_pose without a walk
        self._bytes = 0  # sum of len(jpeg) over _frames
        self.too_large = 0  # frames refused because one JPEG exceeded the whole cap; only add changes it
        self._quality = quality
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        """The JPEG bytes held (``spava_archive_bytes``)."""
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._frames)

    def add(self, camera: str, stamp_ns: int, rgb: np.ndarray, pose: Pose | None = None) -> None:
        """Keep ``rgb`` (H, W, 3) uint8 as JPEG, dropping the oldest frames until it fits under the cap."""
        if self.capacity_bytes == 0:
            return
        _, data = encode_compressed_image(rgb, "jpeg", self._quality)
        with self._lock:
            if len(data) > self.capacity_bytes:
                self.too_large += 1
                return
            while self._bytes + len(data) > self.capacity_bytes:
                old = self._frames.popleft()
                self._bytes -= len(old.jpeg)
                same = self._by_stamp[old.stamp_ns]
                del same[next(i for i, f in enumerate(same) if f is old)]  # by identity; a few share a stamp at most
                if not same:
                    del self._by_stamp[old.stamp_ns]
            frame = _Archived(camera, stamp_ns, data, pose)
            self._frames.append(frame)
            self._by_stamp.setdefault(stamp_ns, []).append(frame)
            self._bytes += len(data)

    def set_pose(self, stamp_ns: int, pose: Pose | None) -> None:
        """Give the archived frames stamped ``stamp_ns`` (any camera: the robot has one pose at a stamp) ``pose``.

        The model worker resolves a frame's pose at ingest, after the frame was archived; this
        makes the archived copy carry the pose its block got. A frame already dropped from the
        archive is not found and nothing changes. A dictionary lookup, not a walk of the archive:
        it runs once per ingested frame.
        """
        with self._lock:
            for frame in self._by_stamp.get(stamp_ns, ()):
                frame.pose = pose

    def window(self, since_ns: int, until_ns: int, cameras: list[str], most: int) -> list[tuple[str, int, np.ndarray, Pose | None]]:
        """(camera, stamp, RGB, pose) of the archived frames in the window, stamp order, evenly thinned to ``most``."""
        with self._lock:
            hits = [f for f in self._frames if f.stamp_ns >= since_ns and (not until_ns or f.stamp_ns <= until_ns)
                    and (not cameras or f.camera in cameras)]
        hits.sort(key=lambda f: f.stamp_ns)
        if len(hits) > most:
            hits = [hits[round(i * (len(hits) - 1) / (most - 1))] for i in range(most)] if most > 1 else hits[-1:]
        return [(f.camera, f.stamp_ns, decode_compressed_image("rgb8; jpeg compressed bgr8", f.jpeg), f.pose) for f in hits]
