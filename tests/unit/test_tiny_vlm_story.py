"""videokv-tiny's demo story (``tinyvlm/story.py``): each question's window holds exactly the
frames of its scenes, and the node's 1 fps sampler takes one frame of every scene."""

from __future__ import annotations

import numpy as np
import pytest

from videokv_node.ingest.sampler import FrameSampler, SamplerConfig, SampleDecision
from videokv_node.tinyvlm.render import render
from videokv_node.tinyvlm.story import STORY, Story

START = 1_700_000_000 * 10**9


def test_windows_hold_exactly_their_segments_frames_and_cover_the_story():
    story = Story(fps=4.0)
    frames = list(story.frames(START))
    assert len(frames) == len(story) == 4 * sum(len(seg.scenes) for seg in STORY)
    covered = []
    for k, seg in enumerate(story.segments):
        since, until = story.window(k, START)
        inside = [rgb for stamp, rgb in frames if since <= stamp <= until]
        assert len(inside) == 4 * len(seg.scenes)
        expected = [render(s) for s in seg.scenes for _ in range(4)]
        assert all(np.array_equal(a, b) for a, b in zip(inside, expected))
        covered += [stamp for stamp, _ in frames if since <= stamp <= until]
    assert covered == [stamp for stamp, _ in frames]  # windows tile the story, no frame twice


def test_one_frame_of_every_scene_is_sampled_at_one_per_second():
    story = Story(fps=4.0)
    sampler = FrameSampler(SamplerConfig(sample_fps=1.0))
    kept = [stamp for stamp, _ in story.frames(START) if sampler.offer("/cam", stamp) == SampleDecision.ACCEPT]
    per_segment = [sum(story.window(k, START)[0] <= s <= story.window(k, START)[1] for s in kept) for k in range(len(STORY))]
    assert per_segment == [len(seg.scenes) for seg in STORY]


def test_motion_segment_moves_one_shape_left_to_right():
    motion = next(seg for seg in STORY if "move" in seg.question)
    assert [s.shapes[0].column for s in motion.scenes] == ["left", "middle", "right"] and motion.answer == "right"
    assert len({(s.shapes[0].colour, s.shapes[0].shape) for s in motion.scenes}) == 1


@pytest.mark.parametrize("fps, seconds", [(0.0, 1.0), (4.0, 0.0)])
def test_bad_timing_is_refused(fps, seconds):
    with pytest.raises(ValueError):
        Story(fps=fps, seconds_per_scene=seconds)
