"""A robot's hour: seeded streams of real footage with things seen once or a few times, and a planner's questions.

At the node's default ``sample_fps`` 0.5 an hour is 1,800 sampled frames per camera. A stream here
is ``n_frames`` sampled frames ``period_s`` apart, composed from ``eval/footage.py``'s real clips
and photographs into shots that look like a robot's day:

- **moving** stretches: a clip played forward (a few source frames per sample), or a pan and zoom
  over a photograph;
- **still** stretches: one view for 1 to 10 minutes, with fresh sensor noise in every frame;
- **revisits**: an earlier shot's place again, later, seen a little shifted;
- **things** (the needles): three coloured shapes drawn into the footage (what ``videokv-tiny``
  names, docs/MODELS.md), each shown in 1 to 3 consecutive sampled frames, once, or two or three
  times minutes apart. Large (a side of 50-70% of the frame's height): drawn at 30-45% the model
  named the colour of 6 of 13 and the shape of 9 of 13 from the frame alone, at 50-70% 8 and 11 of
  13 (3 streams, 2026-11-27). Numbers are not among them: printed on a card in the footage, the
  model read 2 or 3 of 11, chance (on a card or not, at either size), so a question about one
  would measure the reading, not the memory.

Optionally (``real_things``, issue 32 with issue 34's real things): held-out real photographs
(``tinyvlm/things_heldout.py``: never trained on, truth by hand), each glimpsed once, in 1 to 3 consecutive
sampled frames that show a view of the photograph instead of the shot (the robot turning to look at it), at
frames no other thing is shown near; drawn from a Generator of their own, so a stream without them is the
same as before. Their ``~/locate`` truths join the shapes'; the questions stay the shapes' (an "after"
question's options are shapes, so a real thing glimpsed between two shapes does not change its answer).

Everything comes from one ``numpy`` Generator per stream (``make_hour_stream(seed=...)``): the
same seed and library give the same pixels everywhere. Frames are made on demand (``frame(i)``),
so an hour of camera-sized frames never sits in memory. The questions (``eval/hour_questions.py``)
are built from the stream's truth.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw

from videokv_node.eval.footage import FootageLibrary, sensor_noise, view
from videokv_node.tinyvlm.render import draw_shape
from videokv_node.tinyvlm.scenes import COLOURS, SHAPES

CAMERA_SIZE = (640, 480)  # (width, height) of a frame
PERIOD_S = 2.0  # the node's default sample_fps 0.5
STILL_FRAMES = (30, 300)  # 1 to 10 minutes at PERIOD_S
MOVING_FRAMES = (15, 90)  # half a minute to 3 minutes
NOISE_SIGMA = (1.5, 4.0)  # sensor noise, grey levels
REVISIT_SHARE = 0.25  # share of shots (after the first few) that return to an earlier place
THING_SIDE = (0.50, 0.70)  # a shape's side as a share of the frame's height (module doc)
# The benches' real things (``bench.hour``, ``bench.hour_ros``): held-out photographs of five things videokv-tiny v5
# names (docs/bench/things.md); one (the squirrel) is also a photograph of the footage, so its pans show it too.
HOUR_REAL_THINGS = ("opencv:apple.jpg", "opencv:butterfly.jpg", "opencv:squirrel_cls.jpg", "opencv:chicky_512.png",
                    "opencv:licenseplate_motion.jpg")


def default_real_things() -> tuple[str, ...]:
    """``HOUR_REAL_THINGS`` where opencv-doc's photographs are unpacked (scripts/setup_footage.sh), else none."""
    from videokv_node.eval.footage import opencv_data_dir

    return HOUR_REAL_THINGS if opencv_data_dir() is not None else ()


@dataclass(frozen=True, slots=True)
class Shot:
    """Frames ``start .. start + length - 1`` of the stream: one kind of camera motion over one source."""

    kind: str  # 'clip' (played forward), 'pan' (over a photograph) or 'still' (one view, noise only)
    source: str  # a FootageLibrary clip or photograph
    start: int
    length: int
    place: int  # which place it shows: a revisit repeats an earlier shot's place
    clip_start: int = 0  # clip: first source frame; still on a clip: the frame held
    clip_step: float = 1.0  # clip: source frames per sampled frame
    path: tuple[float, float, float, float, float, float] = (0.5, 0.5, 1.0, 0.5, 0.5, 1.0)  # (cx, cy, zoom) at start, at end
    noise: float = 2.0  # sensor noise sigma


@dataclass(frozen=True, slots=True)
class Thing:
    """Something a planner asks about: a coloured shape."""

    colour: str  # a key of COLOURS
    shape: str  # one of SHAPES

    @property
    def name(self) -> str:
        """As options and answers name it: 'red circle'."""
        return f"{self.colour} {self.shape}"

    @property
    def subject(self) -> str:
        """As a planner asks ``~/locate`` for it: 'the red circle'."""
        return f"the {self.name}"


@dataclass(frozen=True, slots=True)
class RealThing:
    """A held-out real photograph's thing (``tinyvlm/things_heldout.py``), named by its first truth noun."""

    noun: str  # 'dog'
    source: str  # 'opencv:chicky_512.png'

    @property
    def name(self) -> str:
        return self.noun

    @property
    def subject(self) -> str:
        return f"the {self.noun}"


@dataclass(frozen=True, slots=True)
class Appearance:
    """One showing of a thing: the sampled frames that hold it and where it is drawn."""

    thing: int  # index into HourStream.things
    frames: tuple[int, ...]  # consecutive frame indices
    x: float  # centre, share of the frame's width
    y: float  # centre, share of the frame's height
    side: float  # share of the frame's height


@dataclass(frozen=True, slots=True)
class HourStream:
    video_id: str
    n_frames: int
    period_s: float
    size: tuple[int, int]
    seed: int
    shots: tuple[Shot, ...]
    things: tuple[Thing, ...]
    appearances: tuple[Appearance, ...]  # in time order
    library: FootageLibrary
    real_things: tuple[RealThing, ...] = ()
    real_appearances: tuple[Appearance, ...] = ()  # ``thing`` indexes real_things; in time order

    def stamp(self, i: int) -> float:
        """Seconds from the stream's start of frame ``i`` (never 0: a zero stamp means unstamped to the node)."""
        return (i + 1) * self.period_s

    def index_of(self, stamp_ns: int) -> int:
        """The frame stamped ``stamp_ns`` (nanoseconds, as the memory cites it): ``stamp``'s inverse."""
        return round(stamp_ns / 1e9 / self.period_s) - 1

    def shot_of(self, i: int) -> Shot:
        return next(s for s in self.shots if s.start <= i < s.start + s.length)

    def appearances_of(self, thing: int, before: int | None = None) -> list[Appearance]:
        """A thing's appearances in time order, only those whose frames all come before frame ``before``."""
        return [a for a in self.appearances if a.thing == thing and (before is None or a.frames[-1] < before)]

    def frame(self, i: int) -> np.ndarray:
        """(H, W, 3) uint8 RGB of frame ``i``: the shot's view, sensor noise, and any thing shown then."""
        shot = self.shot_of(i)
        u = (i - shot.start) / max(1, shot.length - 1)  # progress through the shot, 0..1
        x0, y0, z0, x1, y1, z1 = shot.path
        cx, cy, zoom = x0 + (x1 - x0) * u, y0 + (y1 - y0) * u, z0 + (z1 - z0) * u
        index = shot.clip_start + (round((i - shot.start) * shot.clip_step) if shot.kind == "clip" else 0)
        rgb = view(self.library.image(shot.source, index), cx, cy, zoom, self.size)
        glimpse = next((a for a in self.real_appearances if i in a.frames), None)
        if glimpse is not None:  # a real thing fills the view (module doc)
            rgb = view(real_photo(self.real_things[glimpse.thing].source), glimpse.x, 0.5, 1.25, self.size)
        rng = np.random.default_rng([self.seed, i])
        rgb = sensor_noise(rgb, rng, shot.noise)
        for a in self.appearances:
            if i in a.frames:
                rgb = draw_thing(rgb, self.things[a.thing], a, rng)
        return rgb



def draw_thing(rgb: np.ndarray, thing: Thing, at: Appearance, rng: np.random.Generator) -> np.ndarray:
    """``rgb`` with ``thing`` drawn at ``at``: a filled shape in its colour (jittered), as the renderer of
    videokv-tiny's training draws them (tinyvlm/render.py)."""
    img = Image.fromarray(rgb)
    draw = ImageDraw.Draw(img)
    h = img.height
    x, y, r = at.x * img.width, at.y * h, at.side * h / 2
    draw_shape(draw, thing.shape, thing.colour, x, y, r, rng)
    return np.asarray(img).copy()


def _shots(n_frames: int, library: FootageLibrary, rng: np.random.Generator) -> list[Shot]:
    """Moving and still shots, with revisits, until ``n_frames`` are covered (the last one cut to fit)."""
    clips, photos = sorted(library.clips), sorted(library.photos)
    shots: list[Shot] = []
    start = 0
    while start < n_frames:
        if len(shots) >= 3 and rng.random() < REVISIT_SHARE:  # an earlier place again, a little shifted
            old = shots[int(rng.integers(len(shots)))]
            dx, dy = rng.uniform(-0.05, 0.05, 2)
            p = old.path
            length = int(rng.integers(*(STILL_FRAMES if old.kind == "still" else MOVING_FRAMES)))
            shot = Shot(old.kind, old.source, start, length, old.place, old.clip_start, old.clip_step,
                        (p[0] + dx, p[1] + dy, p[2], p[3] + dx, p[4] + dy, p[5]), float(rng.uniform(*NOISE_SIGMA)))
        else:
            kind = str(rng.choice(["clip", "pan", "still"], p=[0.35, 0.25, 0.40]))
            noise = float(rng.uniform(*NOISE_SIGMA))
            if kind == "still":
                source = str(rng.choice(clips + photos))
                held = int(rng.integers(len(library.clips[source]))) if source in library.clips else 0
                c = (float(rng.uniform(0.35, 0.65)), float(rng.uniform(0.35, 0.65)), float(rng.uniform(1.0, 1.6)))
                shot = Shot("still", source, start, int(rng.integers(*STILL_FRAMES)), len(shots), held, 0.0, c + c, noise)
            elif kind == "clip":
                source = str(rng.choice(clips))
                n_src = len(library.clips[source])
                step = float(rng.uniform(0.5, 2.0))
                length = min(int(rng.integers(*MOVING_FRAMES)), max(2, int(n_src / step)))
                first = int(rng.integers(max(1, n_src - int(length * step))))
                c = (0.5, 0.5, float(rng.uniform(1.0, 1.3)))
                shot = Shot("clip", source, start, length, len(shots), first, step, c + c, noise)
            else:
                source = str(rng.choice(photos))
                a, b = rng.uniform(0.25, 0.75, 2), rng.uniform(0.25, 0.75, 2)
                z0, z1 = rng.uniform(1.2, 2.5, 2)
                shot = Shot("pan", source, start, int(rng.integers(*MOVING_FRAMES)), len(shots), 0, 0.0,
                            (float(a[0]), float(a[1]), float(z0), float(b[0]), float(b[1]), float(z1)), noise)
        shot = replace(shot, length=min(shot.length, n_frames - start))
        shots.append(shot)
        start += shot.length
    return shots


def _things(rng: np.random.Generator) -> list[Thing]:
    """Three shapes of three different shapes and colours: a question names one by either."""
    colours = [str(c) for c in rng.permutation(list(COLOURS))[:3]]
    shapes = [str(s) for s in rng.permutation(list(SHAPES))]
    return [Thing(c, s) for c, s in zip(colours, shapes)]


def _appearances(n_frames: int, things: list[Thing], rng: np.random.Generator) -> list[Appearance]:
    """Two things once and one 2 or 3 times; appearances spread over the whole stream, at least ``gap``
    frames apart, none in the first or last 2% (a question must reach back)."""
    counts = [1] * len(things)
    counts[int(rng.integers(len(things)))] = int(rng.integers(2, 4))
    total = sum(counts)
    lo, hi = max(1, n_frames // 50), n_frames - max(4, n_frames // 50)
    gap = max(6, (hi - lo) // (2 * total))
    for _ in range(1000):
        starts = np.sort(rng.choice(np.arange(lo, hi - 3), total, replace=False))
        if np.all(np.diff(starts) >= gap):
            break
    else:  # pragma: no cover - the gap leaves room for every draw above
        raise RuntimeError("could not place the appearances")
    order = [t for t, c in enumerate(counts) for _ in range(c)]
    order = [order[i] for i in rng.permutation(len(order))]
    out = []
    for t, s in zip(order, starts):
        length = int(rng.integers(1, 4))
        side = float(rng.uniform(*THING_SIDE))
        x = float(rng.uniform(0.15 + side / 2, 0.85 - side / 2))
        y = float(rng.uniform(0.1 + side / 2, 0.9 - side / 2))
        out.append(Appearance(t, tuple(range(int(s), int(s) + length)), x, y, side))
    return out


@lru_cache(maxsize=16)
def real_photo(source: str) -> np.ndarray:
    from videokv_node.tinyvlm.things import real_image

    return real_image(source)


def _real_appearances(n_frames: int, count: int, taken: list[Appearance], seed: int) -> list[Appearance]:
    """``count`` glimpses of 1-3 frames, each at least ``gap`` frames from any other appearance, none in the first
    or last 2%; x is the view's centre across the photograph."""
    rng = np.random.default_rng([seed, 34])
    lo, hi = max(1, n_frames // 50), n_frames - max(4, n_frames // 50)
    gap = max(3, (hi - lo) // (4 * (len(taken) + count)))
    busy = [f for a in taken for f in a.frames]
    out: list[Appearance] = []
    for t in range(count):
        for _ in range(1000):
            start, length = int(rng.integers(lo, hi - 3)), int(rng.integers(1, 4))
            frames = tuple(range(start, start + length))
            if all(abs(f - b) >= gap for f in frames for b in busy):
                break
        else:  # pragma: no cover - the gap leaves room for every draw above
            raise RuntimeError("could not place the real things")
        busy += frames
        out.append(Appearance(t, frames, float(rng.uniform(0.4, 0.6)), 0.5, 1.0))
    return sorted(out, key=lambda a: a.frames[0])


def make_hour_stream(video_id: str, n_frames: int, seed: int, library: FootageLibrary, period_s: float = PERIOD_S,
                     size: tuple[int, int] = CAMERA_SIZE, real_things: tuple[str, ...] = ()) -> HourStream:
    """One stream: shots covering ``n_frames`` frames, three things and their appearances, and each of the held-out
    ``real_things`` (sources of ``tinyvlm/things_heldout.py``) glimpsed once (module doc)."""
    if n_frames < 100:
        raise ValueError(f"an hour stream needs at least 100 frames, got {n_frames}")
    rng = np.random.default_rng(seed)
    shots = _shots(n_frames, library, rng)
    things = _things(rng)
    appearances = _appearances(n_frames, things, rng)
    real: list[RealThing] = []
    if real_things:
        from videokv_node.tinyvlm.things_heldout import held_out_items

        real = [RealThing(item.truth[0], item.source) for item in held_out_items(real_things, "real things")]
    glimpses = _real_appearances(n_frames, len(real), appearances, seed) if real else []
    return HourStream(video_id, n_frames, period_s, size, seed, tuple(shots), tuple(things), tuple(appearances), library,
                      tuple(real), tuple(glimpses))
