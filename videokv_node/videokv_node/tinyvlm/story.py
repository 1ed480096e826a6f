"""The demo's camera story for ``videokv-tiny``: scenes the model was trained to describe, in time.

``make demo`` publishes it as a camera (``programs/synthetic_camera.py --story``) and asks, for each
segment, its question restricted to the segment's time window, so an answer rests on the
frames that show it and its evidence stamps point at them. The scenes are drawn by
``tinyvlm.render.render`` (the training renderer) with seeds fixed here once; they are not
in the training pool (other seeds), and they were not picked for the answers they get.

Each scene is held for ``seconds_per_scene`` of scene time; the node samples one frame per
second by default, so one frame per scene reaches memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from videokv_node.tinyvlm.render import render
from videokv_node.tinyvlm.scenes import COLUMNS, Scene, Shape

NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class StorySegment:
    """Consecutive scenes (one per ``seconds_per_scene``) and the question their window answers."""

    scenes: tuple[Scene, ...]
    question: str
    answer: str


STORY = (
    StorySegment((Scene((Shape("red", "square", "left"),), seed=9001),), "What colour is the shape?", "red"),
    StorySegment(tuple(Scene((Shape("blue", "circle", c),), seed=9002 + i) for i, c in enumerate(COLUMNS)),
                 "Which way did the blue circle move?", "right"),
    StorySegment((Scene(digit="7", seed=9005),), "What number is written?", "7"),
    StorySegment((Scene((Shape("green", "circle", "left"), Shape("yellow", "square", "middle"),
                         Shape("red", "triangle", "right")), seed=9006),), "How many shapes are there?", "three"),
    StorySegment((Scene((Shape("yellow", "triangle", "right"),), seed=9007),), "What shape is it?", "triangle"),
    StorySegment((Scene((Shape("green", "square", "middle"),), seed=9008),), "Where is the shape?", "middle"),
)


class Story:
    """The segments laid out in scene time: frame ``i`` is stamped ``start_ns + i / fps``."""

    def __init__(self, segments: tuple[StorySegment, ...] = STORY, fps: float = 4.0, seconds_per_scene: float = 1.0):
        if fps <= 0 or seconds_per_scene <= 0:
            raise ValueError("fps and seconds_per_scene must be positive")
        self.segments, self.fps = segments, fps
        self.frames_per_scene = max(1, round(fps * seconds_per_scene))
        self._scenes = [s for seg in segments for s in seg.scenes]
        self._pixels: dict[Scene, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._scenes) * self.frames_per_scene

    def stamp_ns(self, i: int, start_ns: int = 0) -> int:
        return start_ns + round(i * NS / self.fps)

    def frames(self, start_ns: int = 0) -> Iterator[tuple[int, np.ndarray]]:
        """(stamp_ns, (224, 224, 3) uint8 RGB) for every frame, in order."""
        for i in range(len(self)):
            scene = self._scenes[i // self.frames_per_scene]
            if scene not in self._pixels:
                self._pixels[scene] = render(scene)
            yield self.stamp_ns(i, start_ns), self._pixels[scene]

    def window(self, k: int, start_ns: int = 0) -> tuple[int, int]:
        """(since_ns, until_ns), both inclusive, holding exactly the frames of segment ``k``."""
        first = sum(len(seg.scenes) for seg in self.segments[:k]) * self.frames_per_scene
        last = first + len(self.segments[k].scenes) * self.frames_per_scene - 1
        return self.stamp_ns(first, start_ns), self.stamp_ns(last, start_ns)
