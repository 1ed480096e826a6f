"""A deterministic synthetic camera with ground truth, for demos and tests.

Memory policies need questions with known answers ("when did the blue ball cross?",
"is the toolbox still there?") without a camera, a bag or a dataset download. A
scenario scripts flat-coloured shapes (and optionally a printed digit) that appear,
move along piecewise-linear paths and disappear; every frame comes with its truth.

Invariants:
- ``frame(i)`` depends only on (width, height, seed, scenario, textured, i): the
  same arguments give the same bytes, in any order of calls;
- the seed only changes the background texture, never the truth;
- an object is visible in frame i iff ``start <= i < end`` and its centre lies in
  the image; objects are drawn in script order, later over earlier, over the digit;
- every pixel of a shape has exactly its ``COLOURS`` value, so the pixel at a
  visible object's centre has its colour unless a later object covers it (the
  default scenario keeps objects apart).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30), "green": (30, 170, 60), "blue": (30, 70, 220), "yellow": (240, 210, 30),
    "white": (250, 250, 250), "orange": (245, 130, 20), "purple": (140, 40, 170),
}
SHAPES = ("square", "circle", "triangle")
# Seven-segment layout: segments a..g lit per digit.
_SEGMENTS = {0: "abcdef", 1: "bc", 2: "abdeg", 3: "abcdg", 4: "bcfg",
             5: "acdfg", 6: "acdefg", 7: "abc", 8: "abcdefg", 9: "abcdfg"}


class VisibleObject(NamedTuple):
    shape: str  # one of SHAPES
    colour: str  # key of COLOURS
    centre: tuple[int, int]  # (x, y) in pixels
    size: int  # side (square, triangle) or diameter (circle) in pixels


@dataclass(frozen=True, slots=True)
class FrameTruth:
    index: int  # frame index in the scenario
    stamp_ns: int  # header stamp the frame is published with
    objects: tuple[VisibleObject, ...]  # visible objects, in drawing order
    caption: str  # one-sentence description, for demos and expected answers
    digit: int | None = None  # the printed digit in view, if any


@dataclass(frozen=True, slots=True)
class ScriptedObject:
    name: str  # what demo questions call it ("toolbox")
    shape: str  # one of SHAPES
    colour: str  # key of COLOURS
    size: float  # side/diameter as a fraction of min(width, height)
    start: int  # first frame shown
    end: int  # one past the last frame shown
    path: tuple[tuple[int, float, float], ...]  # (frame, x, y) keyframes, x/y in [0, 1] of the image

    def __post_init__(self) -> None:
        if self.shape not in SHAPES or self.colour not in COLOURS:
            raise ValueError(f"{self.name}: shape must be in {SHAPES}, colour in {tuple(COLOURS)}")
        if not (0 <= self.start < self.end and 0 < self.size <= 1 and self.path):
            raise ValueError(f"{self.name}: need 0 <= start < end, 0 < size <= 1 and a non-empty path")
        if any(a[0] >= b[0] for a, b in zip(self.path, self.path[1:])):
            raise ValueError(f"{self.name}: path keyframes must have strictly increasing frames")

    def position(self, i: int) -> tuple[float, float]:
        """Centre at frame i as image fractions: linear between keyframes, held outside them."""
        frames, xs, ys = zip(*self.path)
        return float(np.interp(i, frames, xs)), float(np.interp(i, frames, ys))


@dataclass(frozen=True, slots=True)
class ScriptedDigit:
    value: int  # 0..9, drawn as a seven-segment digit
    colour: str  # key of COLOURS
    start: int  # first frame shown
    end: int  # one past the last frame shown
    x: float  # centre, fraction of width
    y: float  # centre, fraction of height
    size: float = 0.25  # height as a fraction of the image height

    def __post_init__(self) -> None:
        if self.value not in range(10) or self.colour not in COLOURS or not 0 <= self.start < self.end:
            raise ValueError(f"digit: need value in 0..9, colour in {tuple(COLOURS)}, 0 <= start < end")


@dataclass(frozen=True, slots=True)
class Scenario:
    n_frames: int  # frames the scenario lasts
    objects: tuple[ScriptedObject, ...]  # drawn in this order
    digit: ScriptedDigit | None = None

    def __post_init__(self) -> None:
        if self.n_frames < 1:
            raise ValueError(f"a scenario needs at least one frame, got {self.n_frames}")


@dataclass(frozen=True, slots=True)
class ObjectEvents:
    name: str
    shape: str  # one of SHAPES, or "digit"
    colour: str
    first_frame: int  # first frame in which it is visible
    last_frame: int  # last frame in which it is visible (inclusive)
    first_stamp_ns: int
    last_stamp_ns: int


def default_scenario(n_frames: int = 60) -> Scenario:
    """A red toolbox enters left and stays, a green apple sits on the table a while,
    a blue ball crosses right to left, a digit 7 is shown, a yellow cone appears at the end."""
    if n_frames < 20:
        raise ValueError(f"the default scenario needs >= 20 frames to tell its events apart, got {n_frames}")
    f = lambda a: int(round(a * n_frames))  # noqa: E731 - fraction of the scenario -> frame
    return Scenario(n_frames, (
        ScriptedObject("toolbox", "square", "red", 0.22, f(0.1), n_frames,
                       ((f(0.1), 0.06, 0.72), (f(0.25), 0.22, 0.72))),
        ScriptedObject("apple", "circle", "green", 0.12, f(0.2), f(0.5), ((0, 0.45, 0.55),)),
        ScriptedObject("ball", "circle", "blue", 0.16, f(0.35), f(0.65),
                       ((f(0.35), 0.95, 0.25), (f(0.65) - 1, 0.05, 0.25))),
        ScriptedObject("cone", "triangle", "yellow", 0.2, f(0.85), n_frames, ((0, 0.7, 0.7),)),
    ), ScriptedDigit(7, "white", f(0.5), f(0.8), 0.85, 0.45))


def _where(x: int, y: int, w: int, h: int) -> str:
    col = ("left", "centre", "right")[min(3 * x // w, 2)]
    row = ("top", "middle", "bottom")[min(3 * y // h, 2)]
    return "at the centre" if (row, col) == ("middle", "centre") else f"at the {row} {col}"


def _motion(obj: ScriptedObject, i: int) -> str:
    """Caption suffix like ' moving left' when the object moves from frame i to i + 1, else ''."""
    (x0, y0), (x1, y1) = obj.position(i), obj.position(i + 1)
    if i + 1 >= obj.end or (x0, y0) == (x1, y1):
        return ""
    if abs(x1 - x0) >= abs(y1 - y0):
        return " moving right" if x1 > x0 else " moving left"
    return " moving down" if y1 > y0 else " moving up"


class SyntheticScene:
    """Frames (H, W, 3) uint8 RGB and their ground truth for a scripted scenario."""

    def __init__(self, width: int = 320, height: int = 240, fps: float = 2.0, seed: int = 0,
                 scenario: Scenario | None = None, textured: bool = True) -> None:
        if width < 16 or height < 16 or not fps > 0:
            raise ValueError(f"need width, height >= 16 and fps > 0, got {width}x{height} at {fps}")
        self.width, self.height, self.fps, self.seed = width, height, fps, seed
        self.scenario = scenario if scenario is not None else default_scenario()
        self._background = self._make_background(textured)  # (H, W, 3) uint8, read-only

    def _make_background(self, textured: bool) -> np.ndarray:
        h, w = self.height, self.width
        if not textured:
            bg = np.full((h, w, 3), 128, np.uint8)
        else:  # wall-to-floor gradient, 16 px tiles and fine grain: grey, never a shape colour
            rng = np.random.default_rng(self.seed)
            grad = np.linspace(150.0, 95.0, h)[:, None]  # (H, 1)
            tiles = rng.normal(0.0, 5.0, (h // 16 + 1, w // 16 + 1)).repeat(16, 0).repeat(16, 1)[:h, :w]
            grey = grad + tiles + rng.normal(0.0, 2.0, (h, w))  # (H, W)
            tint = np.array([1.0, 1.0, 1.06])  # a slightly bluish room
            bg = np.clip(grey[:, :, None] * tint, 0, 255).astype(np.uint8)
        bg.flags.writeable = False
        return bg

    def __len__(self) -> int:
        return self.scenario.n_frames

    def _check(self, i: int) -> None:
        if not 0 <= i < len(self):
            raise IndexError(f"frame {i} outside the scenario's {len(self)} frames")

    def _visible(self, i: int) -> list[tuple[ScriptedObject, VisibleObject]]:
        out = []
        for obj in self.scenario.objects:
            fx, fy = obj.position(i)
            x, y = round(fx * (self.width - 1)), round(fy * (self.height - 1))
            if obj.start <= i < obj.end and 0 <= x < self.width and 0 <= y < self.height:
                size = max(3, round(obj.size * min(self.width, self.height)))
                out.append((obj, VisibleObject(obj.shape, obj.colour, (x, y), size)))
        return out

    def _digit(self, i: int) -> ScriptedDigit | None:
        d = self.scenario.digit
        return d if d is not None and d.start <= i < d.end else None

    def stamp_ns(self, i: int) -> int:
        """Header stamp of frame i when the stream starts at 0."""
        return round(i * 1e9 / self.fps)

    def truth(self, i: int) -> FrameTruth:
        """Ground truth of frame i, stamped ``stamp_ns(i)``."""
        self._check(i)
        visible, parts = self._visible(i), []
        for obj, vis in visible:
            where = _where(*vis.centre, self.width, self.height)
            parts.append(f"a {vis.colour} {vis.shape} {where}{_motion(obj, i)}")
        caption = ("In view: " + ", ".join(parts) + ".") if parts else "Nothing in view."
        digit = self._digit(i)
        if digit is not None:
            cx, cy = round(digit.x * (self.width - 1)), round(digit.y * (self.height - 1))
            caption += f" The digit {digit.value} is shown {_where(cx, cy, self.width, self.height)}."
        return FrameTruth(i, self.stamp_ns(i), tuple(v for _, v in visible), caption,
                          None if digit is None else digit.value)

    def frame(self, i: int) -> np.ndarray:
        """Frame i as a fresh (H, W, 3) uint8 RGB array."""
        self._check(i)
        img = self._background.copy()
        digit = self._digit(i)
        if digit is not None:
            self._draw_digit(img, digit)
        for _, vis in self._visible(i):
            self._draw_shape(img, vis)
        return img

    @staticmethod
    def _draw_shape(img: np.ndarray, vis: VisibleObject) -> None:
        (cx, cy), s, half = vis.centre, vis.size, vis.size // 2
        # The s x s box starting at (cx - half, cy - half), clipped to the image (the centre is inside).
        ys = slice(max(cy - half, 0), min(cy - half + s, img.shape[0]))
        xs = slice(max(cx - half, 0), min(cx - half + s, img.shape[1]))
        dy, dx = np.ogrid[ys, xs]  # (h, 1), (1, w) absolute pixel coordinates
        dy, dx = dy - cy, dx - cx  # relative to the centre
        if vis.shape == "circle":
            mask = dx * dx + dy * dy <= (s / 2) ** 2
        elif vis.shape == "triangle":  # apex at the top row, base (width ~ s) at the bottom row
            mask = 2 * np.abs(dx) <= dy + half
        else:
            mask = np.ones(np.broadcast_shapes(dy.shape, dx.shape), bool)  # square: the whole box
        img[ys, xs][mask] = COLOURS[vis.colour]

    def _draw_digit(self, img: np.ndarray, d: ScriptedDigit) -> None:
        h = max(10, round(d.size * self.height))
        w, t = h // 2, max(2, h // 8)  # digit width, stroke thickness
        x0, y0 = round(d.x * (self.width - 1)) - w // 2, round(d.y * (self.height - 1)) - h // 2
        rects = {"a": (0, 0, w, t), "b": (w - t, 0, t, h // 2), "c": (w - t, h // 2, t, h - h // 2),
                 "d": (0, h - t, w, t), "e": (0, h // 2, t, h - h // 2), "f": (0, 0, t, h // 2),
                 "g": (0, h // 2 - t // 2, w, t)}  # (x, y, width, height) inside the digit box
        for seg in _SEGMENTS[d.value]:
            rx, ry, rw, rh = rects[seg]
            ys = slice(max(y0 + ry, 0), max(y0 + ry + rh, 0))
            xs = slice(max(x0 + rx, 0), max(x0 + rx + rw, 0))
            img[ys, xs] = COLOURS[d.colour]

    def frames(self, n: int | None = None, start_stamp_ns: int = 0) -> Iterator[tuple[int, np.ndarray, FrameTruth]]:
        """Yield (stamp_ns, rgb, truth) for the first n frames (all by default), stamps offset by start_stamp_ns."""
        n = len(self) if n is None else n
        if not 0 <= n <= len(self):
            raise ValueError(f"n must be in [0, {len(self)}], got {n}")
        for i in range(n):
            truth = self.truth(i)
            truth = replace(truth, stamp_ns=truth.stamp_ns + start_stamp_ns)
            yield truth.stamp_ns, self.frame(i), truth

    def __iter__(self) -> Iterator[tuple[int, np.ndarray, FrameTruth]]:
        return self.frames()

    def events_summary(self) -> list[ObjectEvents]:
        """When each object (and the digit) was first and last visible, ordered by first appearance.

        Objects never visible are left out. Stamps are those of ``truth`` (start 0).
        """
        seen: dict[tuple[str, str, str], list[int]] = {}  # (name, shape, colour) -> [first, last]
        for i in range(len(self)):
            entries = [(o.name, o.shape, o.colour) for o, _ in self._visible(i)]
            d = self._digit(i)
            if d is not None:
                entries.append((f"digit {d.value}", "digit", d.colour))
            for key in entries:
                seen.setdefault(key, [i, i])[1] = i
        events = [ObjectEvents(*key, a, b, self.stamp_ns(a), self.stamp_ns(b)) for key, (a, b) in seen.items()]
        return sorted(events, key=lambda e: (e.first_frame, e.name))
