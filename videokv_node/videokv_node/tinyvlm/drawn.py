"""Real footage with coloured shapes drawn in, split by source: ``videokv-tiny`` v6's data (issue 43).

A robot's camera sees real places; the hour's needles (``eval/hour_stream.py``) are coloured shapes drawn
into such footage. v5 was trained on shapes over rendered backdrops and on real pictures without shapes,
and read a shape drawn into footage badly (colour 8/13 on single frames). Here every training frame is a
view of a real clip frame or photograph, as ``eval.footage.view`` gives the hour's, with 0 to 3 shapes
drawn in (``draw_shape``, the hour's renderer) at sides from a fifth of the frame's height
(``SIDE_RANGE``) to most of it, anywhere, never overlapping, then filmed (gain, colour cast, blur, sensor
noise: ``tinyvlm/looks.py``'s ranges).

**Split by source** (``SPLITS``; tests/unit/test_drawn.py checks they are disjoint, stereo twins included):
``train`` frames come only from ``TRAIN_SOURCES``; ``val`` (choosing between training runs) from tree.avi
and four photographs; ``test`` (what is reported: the hour and things benches' footage,
``eval.footage.FootageLibrary.load(split="test")``) from two clips and five photographs that no version of
the model trained on (scikit-image's photographs are left out of every split: v1-v4 trained on crops of
them). Sizes: the band ``HELD_OUT_SIDES`` is never drawn in training (the held-out evaluation draws only it).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw

from videokv_node.eval.footage import FOOTAGE_SPLITS
from videokv_node.tinyvlm.looks import BLUR_RANGE, BLUR_SHARE, CAST, GAIN_RANGE, NOISE_RANGE, Look, film
from videokv_node.tinyvlm.render import draw_shape
from videokv_node.tinyvlm.scenes import COLOURS, SHAPES

FRAME_SIZE = (320, 240)  # (width, height): a camera's 4:3, resized to the encoder's square as the node's frames are
SIDE_RANGE = (0.20, 0.75)  # a shape's side, share of the frame's height
HELD_OUT_SIDES = (0.28, 0.36)  # never drawn in training (as tinyvlm.variety.HELD_OUT_SIZES)
THINGS_PER_FRAME = (0.45, 0.35, 0.12, 0.08)  # P(0, 1, 2, 3 shapes)

SPLITS = FOOTAGE_SPLITS  # (clips, photographs) by split: eval/footage.py, the one owner
# More training backdrops for the things head only: scikit-image's colour photographs (in no footage split: v1-v4
# trained on crops of them, so they can never be held out), with red, blue and yellow things of their own (a flag, a
# motorcycle, a cup) the head must not name; color.png left out (flat coloured patches, which the head should name).
HEAD_EXTRA_PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png")
# Train's photographs OF drawn coloured shapes (pic2: a red, a green and a blue square; pic5: a blue square among
# coloured rectangles): what the head is to name, trained as backdrops with "nothing drawn" (v6.3's head and
# v6-head12k: about 430 of 12,800 frames). ``train_things_head --without-shape-drawings`` leaves them out; measured on
# val (2026-11-29) it costs more than it mends (false "green square" on a circuit board 0 -> 7 of 29 frames: pic2's
# noise-textured squares teach what a drawn, flat one is not), so the defaults keep them
# (docs/notes/2026-11-29-issue43-head-backdrops.md).
SHAPE_DRAWINGS = ("pic2.png", "pic5.png")
# Train's colourful photographs: Hasler-Suesstrunk colourfulness (``colourfulness``) at least 35 over the whole
# photograph, SHAPE_DRAWINGS left out. Why: val's and test's photographs score 54-98 (all but stuff.jpg, 14) where 14 of
# train's 28 are grey (0), and the head names fewest things on the most colourful (val's HappyFish.jpg, 94: 58% at
# 0.95): ``train_things_head --colourful-frames`` adds frames over these (measured on val, 2026-11-29: no gain, off by
# default). tests/unit/test_drawn.py recomputes the list.
COLOURFUL_TRAIN_PHOTOS = ("aloeR.jpg", "ela_original.jpg", "graf1.png", "rubberwhale1.png", "smarties.png",
                          "starry_night.jpg")
COLOURFUL_MIN = 35.0


def colourfulness(rgb: np.ndarray) -> float:
    """Hasler and Suesstrunk's colourfulness of an (H, W, 3) RGB image: the spread and mean of its opponent colours
    (R-G, (R+G)/2-B); 0 for grey, about 100 for a saturated, many-coloured picture."""
    img = rgb.astype(np.float64)
    rg = img[..., 0] - img[..., 1]
    yb = 0.5 * (img[..., 0] + img[..., 1]) - img[..., 2]
    return float(np.hypot(rg.std(), yb.std()) + 0.3 * np.hypot(rg.mean(), yb.mean()))


@dataclass(frozen=True, slots=True)
class DrawnThing:
    colour: str
    shape: str
    x: float  # centre, share of the frame's width
    y: float  # centre, share of the frame's height
    side: float  # share of the frame's height

    @property
    def name(self) -> str:
        return f"{self.colour} {self.shape}"


@dataclass(frozen=True, slots=True)
class DrawnFrame:
    """One frame, known exactly: a view of a source, the shapes drawn into it and how it was filmed. Hashable: the
    training caches its encoder features by it."""

    source: str  # a clip (with ``index``) or a photograph of SPLITS
    index: int
    view: tuple[float, float, float]  # (cx, cy, zoom) of eval.footage.view
    things: tuple[DrawnThing, ...]
    gain: float
    cast: tuple[float, float, float]
    blur: float
    noise: float
    seed: int

    @property
    def names(self) -> tuple[str, ...]:
        """The things' names, each once, in drawing order."""
        return tuple(dict.fromkeys(t.name for t in self.things))


def _is_clip(source: str) -> bool:
    return source.endswith((".avi", ".mp4"))


@lru_cache(maxsize=64)
def _source_image(source: str, index: int) -> np.ndarray:
    from videokv_node.tinyvlm.things import clip_frames, real_image

    if _is_clip(source):
        frames = clip_frames(source)
        return frames[min(index, len(frames) - 1)]
    if source in ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png", "color.png"):
        return real_image(f"skimage:{source}")
    return real_image(f"opencv:{source}")


def render_drawn(frame: DrawnFrame, size: tuple[int, int] = FRAME_SIZE) -> np.ndarray:
    """(H, W, 3) uint8 RGB of ``frame``: the same spec always gives the same pixels."""
    from videokv_node.eval.footage import view

    rng = np.random.default_rng(frame.seed)
    img = Image.fromarray(view(_source_image(frame.source, frame.index), *frame.view, size))
    draw = ImageDraw.Draw(img)
    for t in frame.things:
        draw_shape(draw, t.shape, t.colour, t.x * img.width, t.y * img.height, t.side * img.height / 2, rng)
    # filmed as the varied scenes are (the background is the footage's own view: "photo" only names the kind)
    return film(img, Look("photo", frame.gain, frame.cast, frame.blur, frame.noise), rng)


def _side(rng: np.random.Generator, held_out: bool) -> float:
    if held_out:
        return float(rng.uniform(*HELD_OUT_SIDES))
    while True:
        s = float(rng.uniform(*SIDE_RANGE))
        if not HELD_OUT_SIDES[0] <= s <= HELD_OUT_SIDES[1]:
            return s


def _place(rng: np.random.Generator, n: int, held_out: bool, aspect: float) -> list[tuple[float, float, float]]:
    """``n`` (x, y, side) whose bounding squares do not overlap (fewer where 50 tries find no room)."""
    out: list[tuple[float, float, float]] = []
    for _ in range(50):
        if len(out) == n:
            break
        side = _side(rng, held_out)
        half_w, half_h = side / 2 / aspect, side / 2  # in shares of width and height
        x, y = float(rng.uniform(half_w, 1 - half_w)), float(rng.uniform(half_h, 1 - half_h))
        if all(abs(x - ox) * aspect * 2 >= side + os_ or abs(y - oy) * 2 >= side + os_ for ox, oy, os_ in out):
            out.append((x, y, side))
    return out


class DrawnSampler:
    """Frames of one split, seeded: ``frame(things=...)`` draws a spec; ``frames(n)`` n of them with the
    ``THINGS_PER_FRAME`` mixture. ``held_out_sizes``: sides only from ``HELD_OUT_SIDES``."""

    def __init__(self, split: str, seed: int, held_out_sizes: bool = False,
                 sources: tuple[tuple[str, ...], tuple[str, ...]] | None = None):
        """``sources``: (clips, photographs) instead of the split's (``split`` then only names them)."""
        from videokv_node.tinyvlm.things import clip_frames

        clips, photos = sources if sources is not None else SPLITS[split]
        self.sources = [(c, i) for c in clips for i in range(0, len(clip_frames(c)), 2)] + [(p, 0) for p in photos]
        self.photo_share = len(photos) / (len(photos) + len(clips) * 2)
        self.clips, self.photos = clips, photos
        self.rng = np.random.default_rng([seed, 43])
        self.held_out_sizes = held_out_sizes
        self._seed = 0

    def source(self) -> tuple[str, int]:
        if self.rng.random() < 0.5 and self.clips:  # half clips, half photographs, whatever their numbers
            c = self.clips[int(self.rng.integers(len(self.clips)))]
            frames = [s for s in self.sources if s[0] == c]
            return frames[int(self.rng.integers(len(frames)))]
        return self.photos[int(self.rng.integers(len(self.photos)))], 0

    def frame(self, things: tuple[tuple[str, str], ...] | None = None, n_things: int | None = None,
              source: tuple[str, int] | None = None, view: tuple[float, float, float] | None = None) -> DrawnFrame:
        """A spec: ``things`` (colour, shape) pairs, or ``n_things`` random distinct ones, or the mixture."""
        rng = self.rng
        if things is None:
            n = n_things if n_things is not None else int(rng.choice(len(THINGS_PER_FRAME), p=THINGS_PER_FRAME))
            pairs = [(c, s) for c in COLOURS for s in SHAPES]
            things = tuple(pairs[i] for i in rng.permutation(len(pairs))[:n])
        src, index = source or self.source()
        aspect = FRAME_SIZE[0] / FRAME_SIZE[1]
        spots = _place(rng, len(things), self.held_out_sizes, aspect)
        drawn = tuple(DrawnThing(c, s, *spot) for (c, s), spot in zip(things, spots))
        if view is None:
            view = (float(rng.uniform(0.3, 0.7)), float(rng.uniform(0.3, 0.7)), float(rng.uniform(1.0, 2.0)))
        blur = float(rng.uniform(*BLUR_RANGE)) if rng.random() < BLUR_SHARE * 0.5 else 0.0
        self._seed += 1
        return DrawnFrame(src, index, view, drawn, gain=float(rng.uniform(*GAIN_RANGE)),
                          cast=tuple(float(c) for c in 1 + rng.uniform(-CAST, CAST, 3)), blur=blur,
                          noise=float(rng.uniform(*NOISE_RANGE)), seed=int(rng.integers(2**31)))

    def frames(self, n: int) -> list[DrawnFrame]:
        return [self.frame() for _ in range(n)]
