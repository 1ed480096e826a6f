"""bench/load_camera.py's cameras move as the node samples them (bench-load measures ingest, not the still path).

Until 2026-11-27 a camera cycled 30 frames at 15 Hz; the node samples one frame in 30 at its default
``sample_fps`` 0.5, so it saw one picture over and over and merged every frame as still (issue 36).
This checks, with the node's own still test and its default thresholds, that no two consecutive
sampled frames are still for the rates a run uses, and that a cycle commensurate with the sampling
would have been caught.
"""

from __future__ import annotations

import pytest

from bench import load_camera
from videokv_node.memory.records.still_config import RedundancyConfig
from videokv_node.memory.frames.still import is_still, thumbnail


def still_pairs(frames, step: int, samples: int = 40) -> int:
    config = RedundancyConfig(enabled=True)
    thumbs = [thumbnail(frames[(i * step) % len(frames)], config.grid) for i in range(samples)]
    return sum(is_still(b, a, config) for a, b in zip(thumbs, thumbs[1:]))


@pytest.mark.parametrize("hz, sample_fps", [(15.0, 0.5), (15.0, 1.0), (30.0, 0.5)])  # the rates bench-load runs at
def test_sampled_frames_are_never_still(hz, sample_fps):
    frames = load_camera.camera_frames(160, 120, hz, seed=0)
    assert still_pairs(frames, round(hz / sample_fps)) == 0


def test_a_cycle_as_long_as_the_sampling_step_would_be_all_still():
    frames = load_camera.camera_frames(160, 120, 15.0, seed=0)
    step = len(frames)  # one sampled frame per cycle: the same picture every time
    assert still_pairs(frames, step) == 39
