"""Rendered scenes with known content, and the questions ``videokv-tiny`` is trained and evaluated on.

Why rendered: no image-text data set is reachable offline, and a scene drawn from a spec
has its answers known exactly. Every scene is 224 x 224 RGB (the encoder's input size):
a light background, and either coloured shapes in three columns (left / middle / right)
or one printed digit. Everything is drawn from a ``numpy`` Generator, so a seed fixes
the data set on every machine.

``render`` (``tinyvlm/render.py``) draws a scene's pixels.

Answers are short words (``red``, ``circle``, ``left``, ``two``, ``7``, ``red circle``);
``normalise_answer`` is how a generated answer is compared with them.

Real photos join the rendered scenes (``PHOTOS``): the photographs scikit-image ships inside
its wheel, whose content is known (a cat, an astronaut, a cup of coffee, grass, ...). Each is
seen through random crops (``Scene.photo``); questions ask what they show, as the rendered
ones do. Why: the issue asks for them, and without any real picture in training the
projector's inputs from a camera are wholly out of distribution.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SIZE = 224
COLOURS = {"red": (215, 40, 40), "green": (40, 160, 60), "blue": (40, 80, 215), "yellow": (235, 200, 30)}
SHAPES = ("circle", "square", "triangle")
COLUMNS = {"left": 48, "middle": 112, "right": 176}  # x of a column's centre, px
COUNT_WORDS = ("zero", "one", "two", "three")
DIGITS = "0123456789"


@dataclass(frozen=True, slots=True)
class Photo:
    """One of scikit-image's photos and what questions about it are answered with."""

    file: str  # in skimage/data/
    caption: str  # the answer to 'Describe the image.' and 'What is in the image?'
    people: str | None = None  # answer to 'How many people are there?' where the photo shows people
    colour: tuple[str, str] | None = None  # (thing, colour): 'What colour is the <thing>?'


# Chosen by looking at each photo: content that fills most of any crop of at least 60% of the
# picture's shorter side, named as a person would. Colours only where the photo is in colour and
# the colour is plain (grass.png, moon.png, brick.png, horse.png, text.png, camera.png and coins.png
# are grayscale). Left out: scientific and texture images whose names a viewer could not give
# (cells, retina, ihc, microaneurysms, phantom, gravel, ...).
PHOTOS = (
    Photo("chelsea.png", "a cat"),
    Photo("astronaut.png", "an astronaut", people="one"),
    Photo("coffee.png", "a cup of coffee"),
    Photo("rocket.jpg", "a rocket"),
    Photo("motorcycle_left.png", "a motorcycle", colour=("motorcycle", "red")),
    Photo("camera.png", "a man with a camera", people="one"),
    Photo("coins.png", "coins"),
    Photo("moon.png", "the moon"),
    Photo("grass.png", "grass"),
    Photo("brick.png", "a brick wall"),
    Photo("horse.png", "a horse"),
    Photo("text.png", "text"),
    Photo("hubble_deep_field.jpg", "galaxies in space"),
)
PHOTO_BY_FILE = {p.file: p for p in PHOTOS}


def photo_dir() -> Path:
    """scikit-image's data directory, found without importing scikit-image (its lazy loader is not installed)."""
    spec = importlib.util.find_spec("skimage")
    path = None if spec is None or spec.origin is None else Path(spec.origin).parent / "data"
    if path is None or not path.is_dir():
        raise FileNotFoundError("scikit-image is not installed (pip install --no-deps -r requirements/models-nodeps.txt); "
                                "its wheel ships the real photos")
    return path


@dataclass(frozen=True, slots=True)
class Shape:
    colour: str  # a key of COLOURS
    shape: str  # one of SHAPES
    column: str  # a key of COLUMNS; for a free shape, the third of the frame that holds its centre
    # A free shape (tinyvlm.variety): centre and side in px. None: a column shape, its size and place
    # jittered from the scene's seed as in the first renderer.
    x: int | None = None
    y: int | None = None
    side: int | None = None

    @property
    def name(self) -> str:
        """How answers name it: 'red circle'."""
        return f"{self.colour} {self.shape}"


@dataclass(frozen=True, slots=True)
class Scene:
    """What one frame shows: shapes (at most one per column) or a printed digit."""

    shapes: tuple[Shape, ...] = ()
    digit: str | None = None
    seed: int = 0  # draws the jitter: size, exact position, background tint; for a photo its crop and flip
    photo: str | None = None  # a file of PHOTOS: the frame is a random crop of it, nothing is drawn
    look: "Look | None" = None  # tinyvlm.looks.Look: background, lighting, blur; None: the first renderer's light backdrop


@dataclass(frozen=True, slots=True)
class Example:
    """A stream of scenes, a question about it and the one right answer."""

    scenes: tuple[Scene, ...]
    question: str
    answer: str  # with options: the right option's letter ("B")
    kind: str  # which family of question, for per-kind accuracy
    options: tuple[str, ...] = ()  # multiple choice in the node's letter format (tinyvlm.variety.with_letter_options)
    # v5 (tinyvlm/things.py): per frame, the noun block's noun indices (models/nouns.NounBlock) standing in for
    # the ones the encoder's classifier writes; None: the classifier's own
    nouns: tuple[tuple[int, ...], ...] | None = None


def caption(scene: Scene) -> str:
    """The answer to 'Describe the image.'"""
    if scene.photo is not None:
        return PHOTO_BY_FILE[scene.photo].caption
    if scene.digit is not None:
        return f"the number {scene.digit}"
    if len(scene.shapes) == 1:
        s = scene.shapes[0]
        return f"a {s.name} on the {s.column}"
    return f"{COUNT_WORDS[len(scene.shapes)]} shapes"


def cell_words(scene: Scene) -> list[str] | None:
    """What each of the projector's 6 tokens (2 per column, column by column) is aligned to in training:
    per column its colour then its shape ('nothing nothing' where the column is empty), so a frame
    reads 'red circle nothing nothing blue square'; a digit is 'number' and the digit in the middle.
    Free shapes (tinyvlm.variety), which may span columns, name the columns ``column_holders`` gives
    them (v4; the v2 weights were trained with none for free shapes). None for a photo."""
    if scene.photo is not None:
        return None
    if scene.digit is not None:
        return ["nothing", "nothing", "number", scene.digit, "nothing", "nothing"]
    if any(s.x is not None for s in scene.shapes):
        return [w for h in column_holders(scene.shapes) for w in ((h.colour, h.shape) if h is not None else ("nothing", "nothing"))]
    by_column = {s.column: s for s in scene.shapes}
    return [w for c in COLUMNS for w in ((by_column[c].colour, by_column[c].shape) if c in by_column else ("nothing", "nothing"))]


def area_in_columns(shape: Shape, step: float = 0.25) -> np.ndarray:
    """(3,) area in px^2 of a free shape inside each third of the frame, by its vertical extent summed over
    x in ``step`` px strips: a square ``side`` high everywhere, a circle ``2 sqrt(r^2 - u^2)``, the renderer's
    triangle (apex up, base ``side``) ``side (1 - |u| / r)``, ``u`` the distance from the centre's x."""
    r = shape.side / 2
    u = np.arange(-r + step / 2, r, step)
    if shape.shape == "square":
        height = np.full_like(u, 2 * r)
    elif shape.shape == "circle":
        height = 2 * np.sqrt(np.maximum(r * r - u * u, 0))
    else:
        height = 2 * r * (1 - np.abs(u) / r)
    column = np.clip(((shape.x + u) * len(COLUMNS) // SIZE).astype(int), 0, len(COLUMNS) - 1)
    return np.bincount(column, weights=height * step, minlength=len(COLUMNS))


def column_holders(shapes: tuple[Shape, ...]) -> list[Shape | None]:
    """Per column (left to right), the free shape that names it in ``cell_words``: of the shapes with area in
    it, the one with the most, provided that is at least a quarter of the shape's own area or a tenth of
    the column's; None where none does.

    Our choice: a column token sees the whole column (``Projector``), so it names what fills it most; a
    sliver of a shape whose body lies in the next column is too little to name (that column names it)."""
    areas = [area_in_columns(s) for s in shapes]  # per shape (3,)
    out = []
    for column in range(len(COLUMNS)):
        best, best_area = None, 0.0
        for shape, area in zip(shapes, areas):
            if area[column] > best_area:
                best, best_area = (shape, area), float(area[column])
        named = best is not None and (best_area >= 0.25 * float(best[1].sum())
                                      or best_area >= 0.1 * SIZE * SIZE / len(COLUMNS))
        out.append(best[0] if named else None)
    return out


def column_holder(shapes: tuple[Shape, ...], column: int) -> Shape | None:
    """``column_holders(shapes)[column]``."""
    return column_holders(shapes)[column]


def normalise_answer(text: str) -> str:
    """Lower case, punctuation and leading articles dropped: 'The red circle.' -> 'red circle'."""
    words = re.sub(r"[^a-z0-9 ]", " ", text.lower()).split()
    while words and words[0] in ("a", "an", "the"):
        words = words[1:]
    return " ".join(words)


class SceneSampler:
    """Draws scenes and questions from one seeded Generator: the data recipe of the training script."""

    def __init__(self, seed: int, pool: int | None = None, photo_crops: int = 0):
        """``pool``: if set, scenes are picked from a fixed set of about ``pool`` scenes drawn first, so a
        training set of many questions needs few encoder passes (each scene is asked several things).
        ``photo_crops``: crops drawn per photo for ``photo_question`` (0: fresh crops every time)."""
        self.rng = np.random.default_rng(seed)
        self._pools: dict[str, list[Scene]] | None = None
        if pool is not None:
            draw = {"single": self._fresh_single, "several": self._fresh_several, "digit": self._fresh_digit}
            share = {"single": 0.6, "several": 0.2, "digit": 0.2}
            self._pools = {k: [draw[k]() for _ in range(max(1, int(pool * share[k])))] for k in draw}
        # Crops come from a generator of their own, so adding photos leaves every rendered scene and
        # question of the same seed as it was (and a feature cache of them valid).
        self._photo_rng = np.random.default_rng([seed, 1])
        self._crops: dict[str, list[Scene]] | None = None
        if photo_crops:
            self._crops = {p.file: [self.photo(p) for _ in range(photo_crops)] for p in PHOTOS}

    def _pick(self, seq):
        return seq[int(self.rng.integers(len(seq)))]

    def _seed(self) -> int:
        return int(self.rng.integers(2**31))

    def shape(self, column: str | None = None) -> Shape:
        return Shape(self._pick(list(COLOURS)), self._pick(SHAPES), column or self._pick(list(COLUMNS)))

    def _fresh_single(self, shape: Shape | None = None) -> Scene:
        return Scene((shape or self.shape(),), seed=self._seed())

    def _fresh_several(self) -> Scene:
        n = int(self.rng.integers(1, 4))
        columns = sorted(self.rng.choice(list(COLUMNS), n, replace=False), key=list(COLUMNS).index)
        return Scene(tuple(self.shape(str(c)) for c in columns), seed=self._seed())

    def _fresh_digit(self) -> Scene:
        return Scene(digit=self._pick(DIGITS), seed=self._seed())

    def single(self, shape: Shape | None = None) -> Scene:
        """A one-shape scene (showing ``shape`` if given; from the pool when it has one)."""
        if self._pools is None:
            return self._fresh_single(shape)
        matching = [s for s in self._pools["single"] if shape is None or s.shapes[0] == shape]
        return self._pick(matching) if matching else self._fresh_single(shape)

    def several(self) -> Scene:
        return self._fresh_several() if self._pools is None else self._pick(self._pools["several"])

    def digit(self) -> Scene:
        return self._fresh_digit() if self._pools is None else self._pick(self._pools["digit"])

    def distinct_singles(self, n: int) -> list[Scene]:
        """``n`` one-shape scenes whose (colour, shape) pairs all differ, so 'the red circle' names one frame."""
        seen, out = set(), []
        while len(out) < n:
            s = self.single()
            if (s.shapes[0].colour, s.shapes[0].shape) not in seen:
                seen.add((s.shapes[0].colour, s.shapes[0].shape))
                out.append(s)
        return out

    def photo(self, photo: Photo) -> Scene:
        """A crop of ``photo`` (from the drawn crops when the sampler has them)."""
        if self._crops is None:
            return Scene(photo=photo.file, seed=int(self._photo_rng.integers(2**31)))
        return self._crops[photo.file][int(self._photo_rng.integers(len(self._crops[photo.file])))]

    # --- questions --------------------------------------------------------
    def frame_question(self) -> Example:
        """One frame: colour, shape, position, count, digit or caption."""
        kind = self._pick(("colour", "shape", "position", "count", "digit", "caption"))
        if kind == "count":
            scene = self.several()
            return Example((scene,), "How many shapes are there?", COUNT_WORDS[len(scene.shapes)], kind)
        if kind == "digit":
            scene = self.digit()
            return Example((scene,), "What number is written?", scene.digit, kind)
        if kind == "caption":
            scene = self.digit() if self.rng.random() < 0.25 else self.single()
            return Example((scene,), "Describe the image.", caption(scene), kind)
        scene = self.single()
        s = scene.shapes[0]
        question, answer = {
            "colour": ("What colour is the shape?", s.colour),
            "shape": ("What shape is it?", s.shape),
            "position": ("Where is the shape?", s.column),
        }[kind]
        return Example((scene,), question, answer, kind)

    def stream_question(self, n_min: int = 2, n_max: int = 6) -> Example:
        """Several frames answered from memory: order of colours, what came before/after, motion."""
        kind = self._pick(("first", "last", "after", "before", "motion"))
        if kind == "motion":
            s = self.shape()
            path = list(COLUMNS) if self.rng.random() < 0.5 else list(COLUMNS)[::-1]
            scenes = tuple(self.single(Shape(s.colour, s.shape, c)) for c in path)
            answer = "right" if path[0] == "left" else "left"
            return Example(scenes, f"Which way did the {s.name} move?", answer, kind)
        n = int(self.rng.integers(n_min, n_max + 1))
        scenes = self.distinct_singles(n)
        names = [sc.shapes[0] for sc in scenes]
        if kind == "first":
            return Example(tuple(scenes), "Which colour came first?", names[0].colour, kind)
        if kind == "last":
            return Example(tuple(scenes), "Which colour came last?", names[-1].colour, kind)
        i = int(self.rng.integers(0, n - 1)) if kind == "after" else int(self.rng.integers(1, n))
        other = names[i + 1] if kind == "after" else names[i - 1]
        return Example(tuple(scenes), f"What came {kind} the {names[i].name}?", other.name, kind)

    def photo_question(self) -> Example:
        """One crop of a real photo: what it shows, or (where the photo has one) a people count or a colour."""
        rng = self._photo_rng
        photo = PHOTOS[int(rng.integers(len(PHOTOS)))]
        scene = self.photo(photo)
        asks = [(("Describe the image.", "What is in the image?")[int(rng.integers(2))], photo.caption)]
        if photo.people:
            asks.append(("How many people are there?", photo.people))
        if photo.colour:
            asks.append((f"What colour is the {photo.colour[0]}?", photo.colour[1]))
        question, answer = asks[int(rng.integers(len(asks)))]
        return Example((scene,), question, answer, "photo")


# Chance level of each kind: one over the number of answers a guess picks from.
CHANCE = {
    "colour": 1 / len(COLOURS), "shape": 1 / len(SHAPES), "position": 1 / len(COLUMNS), "count": 1 / 3,
    "digit": 1 / len(DIGITS), "caption": 1 / (len(COLOURS) * len(SHAPES) * len(COLUMNS) + len(DIGITS)),
    "first": 1 / len(COLOURS), "last": 1 / len(COLOURS), "after": 1 / (len(COLOURS) * len(SHAPES) - 1),
    "before": 1 / (len(COLOURS) * len(SHAPES) - 1), "motion": 1 / 2, "photo": 1 / len(PHOTOS),
}
