"""The long-replay archive's byte cap (``spava.archive_bytes``), without ROS.

The reference for what the archive must hold is a plain list simulation of "append, then drop the
oldest until the total fits, refuse a frame larger than the cap", over the JPEG sizes the encoder
itself gives (``encode_compressed_image`` at the archive's quality). What is held is read back
through ``window`` (stamps), never from the archive's own bookkeeping alone.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from videokv_node.ingest.frame_archive import FrameArchive
from videokv_node.ingest.image_decode import encode_compressed_image

QUALITY = 90


def noise(seed: int, h: int = 24, w: int = 32) -> np.ndarray:
    """A frame of noise: a large JPEG for its size, different per seed."""
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def flat(value: int) -> np.ndarray:
    """A flat frame: a small JPEG."""
    return np.full((24, 32, 3), value, dtype=np.uint8)


POOL = [noise(s) for s in range(4)] + [flat(v) for v in (0, 128)] + [noise(9, 48, 64)]
SIZES = [len(encode_compressed_image(f, "jpeg", QUALITY)[1]) for f in POOL]


def reference(cap: int, sizes: list[int]) -> tuple[list[int], int]:
    """(indices held, frames refused) of a cap-``cap`` archive fed frames of ``sizes`` in order."""
    held: list[int] = []
    refused = 0
    for i, s in enumerate(sizes):
        if cap == 0:
            continue
        if s > cap:
            refused += 1
            continue
        while sum(sizes[j] for j in held) + s > cap:
            held.pop(0)
        held.append(i)
    return held, refused


def held_stamps(archive: FrameArchive) -> list[int]:
    return [stamp for _, stamp, _, _ in archive.window(0, 0, [], 10**6)]


def test_the_oldest_frames_go_first_and_the_bytes_are_what_is_held():
    s = SIZES
    assert len(set(s[:4])) > 1 and max(s[4:6]) < min(s[:4])  # noise varies, flat frames are smaller
    archive = FrameArchive(s[0] + s[1] + s[2], QUALITY)
    for i in range(3):
        archive.add("/cam", i, POOL[i])
    assert held_stamps(archive) == [0, 1, 2] and archive.bytes == s[0] + s[1] + s[2] == archive.capacity_bytes
    archive.add("/cam", 3, POOL[3])  # no room: frame 0 goes, then 1 if 3 does not fit in 0's place
    expected, _ = reference(archive.capacity_bytes, s[:4])
    assert held_stamps(archive) == expected and expected[0] >= 1 and expected[-1] == 3
    assert archive.bytes == sum(s[i] for i in expected) <= archive.capacity_bytes
    archive.add("/cam", 4, POOL[4])  # a small frame still drops the oldest if the total would exceed the cap
    expected, _ = reference(archive.capacity_bytes, s[:5])
    assert held_stamps(archive) == expected and archive.bytes == sum(s[i] for i in expected)
    assert len(archive) == len(expected) and archive.too_large == 0


def test_a_frame_larger_than_the_whole_cap_is_refused_and_drops_nothing():
    big = SIZES[6]  # 48 x 64 noise
    assert big > SIZES[0] + SIZES[4]
    archive = FrameArchive(SIZES[0] + SIZES[4], QUALITY)
    archive.add("/cam", 1, POOL[0])
    archive.add("/cam", 2, POOL[4])
    archive.add("/cam", 3, POOL[6])
    assert archive.too_large == 1
    assert held_stamps(archive) == [1, 2] and archive.bytes == SIZES[0] + SIZES[4]  # the old frames stay


def test_a_cap_of_zero_keeps_nothing():
    archive = FrameArchive(0, QUALITY)
    archive.add("/cam", 1, POOL[4])
    assert len(archive) == 0 and archive.bytes == 0 and archive.too_large == 0
    with pytest.raises(ValueError, match="capacity_bytes"):
        FrameArchive(-1, QUALITY)


@settings(max_examples=60, deadline=None)
@given(cap=st.integers(0, 3 * max(SIZES)), order=st.lists(st.integers(0, len(POOL) - 1), max_size=25))
def test_never_over_the_cap_and_always_the_reference_suffix(cap, order):
    archive = FrameArchive(cap, QUALITY)
    for stamp, i in enumerate(order):
        archive.add("/cam", stamp, POOL[i])
        assert archive.bytes <= cap
    sizes = [SIZES[i] for i in order]
    expected, refused = reference(cap, sizes)
    assert held_stamps(archive) == expected and archive.too_large == refused
    assert archive.bytes == sum(sizes[j] for j in expected)


def test_an_archived_frame_gets_the_pose_resolved_at_ingest():
    """The worker resolves a frame's pose at ingest, after the camera callback archived it with the pose
    known then; ``set_pose`` gives every archived copy at that stamp (any camera) the block's pose, and a
    frame the cap dropped is neither found nor brought back."""
    import math

    from videokv_node.pose import Pose

    ns = 10**9
    early = Pose.make("odom", (0.0, 0.0, 0.0), (0.0, 0.0, 0.0, 1.0))
    late = Pose.make("odom", (1.0, -2.0, 0.0), (0.0, 0.0, math.sin(0.1), math.cos(0.1)))
    one = len(encode_compressed_image(flat(0), "jpeg", 90)[1])
    archive = FrameArchive(3 * one, 90)  # three flat frames fit
    archive.add("/a", 4 * ns, flat(0), None)
    archive.add("/a", 5 * ns, flat(0), None)
    archive.add("/b", 5 * ns, flat(0), early)
    archive.add("/a", 6 * ns, flat(0), early)  # the frame at 4 s leaves
    archive.set_pose(5 * ns, late)
    archive.set_pose(4 * ns, late)  # dropped from the archive: nothing changes
    archive.set_pose(7 * ns, late)  # never archived
    assert [(c, s, p) for c, s, _, p in archive.window(0, 0, [], 10)] == [
        ("/a", 5 * ns, late), ("/b", 5 * ns, late), ("/a", 6 * ns, early)]
    archive.add("/a", 8 * ns, flat(0), None)
    archive.add("/b", 9 * ns, flat(0), None)  # both frames at 5 s leave, and with them their stamp's entry
    archive.set_pose(5 * ns, early)
    assert [(s, p) for _, s, _, p in archive.window(0, 0, [], 10)] == [(6 * ns, early), (8 * ns, None), (9 * ns, None)]
