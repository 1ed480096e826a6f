"""What a camera shows that the column scenes do not, for videokv-tiny v3: and which of it is held out.

The column scenes of ``tinyvlm.scenes`` (shapes of 40-60 px in three fixed columns on a light
background, one phrasing per question) taught a model that answered its own renders well and
plainly coloured discs drawn by another renderer badly (issue 14). Here a scene's shapes have
any size, from about 1% of the frame's area to most of it, at free positions (several per
frame, never overlapping), on varied backgrounds, under varied lighting and blur; questions come
in many phrasings; and multiple-choice questions in the node's letter format (``with_letter_options``).

Held out, never drawn by ``VariedSampler(held_out=False)`` (training) and always by
``VariedSampler(held_out=True)`` (the evaluation, ``tinyvlm.generalisation.generalisation_examples``):
- sizes: shapes whose side is ``HELD_OUT_SIZES`` of the frame (a band inside the training range);
- backgrounds: ``looks.HELD_OUT_BACKGROUNDS`` (radial gradients, checkerboards, low-frequency blobs,
  and crops of scikit-image photos that training never shows, ``looks.HELD_OUT_PHOTOS``);
- wordings: ``HELD_OUT_WORDINGS`` per question kind.
Lighting and blur are drawn from the same ranges in both (held out they would only test more of the same).
How a frame is lit and filmed, and its backdrops, are in ``tinyvlm/looks.py``.

Our choice: a shape's column (its ``position`` answer) is the
third of the frame that holds its centre; centres are kept ``POSITION_MARGIN`` px away from the
thirds' borders so that the answer is never a coin toss.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from videokv_node.models.chat_adapter import OPTION_LETTERS
from videokv_node.tinyvlm.looks import draw_look
from videokv_node.tinyvlm.scenes import COLOURS, COUNT_WORDS, SHAPES, SIZE, Example, Scene, Shape

# --- sizes: a shape's side (circle's diameter, triangle's base) as a fraction of the frame's side ---------
SIZE_RANGE = (0.10, 0.85)  # about 1% of the frame's area (a small circle) up to 72% (a large square)
HELD_OUT_SIZES = (0.28, 0.36)  # never drawn in training; every held-out shape is drawn from it
MAX_SIZE_FOR_COUNT = {1: 0.85, 2: 0.45, 3: 0.36}  # largest side with n shapes in a frame, so n fit without overlap
POSITION_MARGIN = 6  # px: no centre within this distance of a border between thirds
THIRDS = (SIZE / 3, 2 * SIZE / 3)

# --- wordings: '{colour}' and '{shape}' are filled with the scene's shape where a template names them ------
WORDINGS = {
    "colour": (
        "What colour is the shape?", "Which colour is the object?", "What color is the shape?",
        "Tell me the colour of the shape.", "what colour?", "What colour is the {shape}?",
        "Name the colour of the object.", "What is the colour of the shape?", "Which color is it?",
        "What colour do you see?", "What color is the object in the image?",
    ),
    "shape": (
        "What shape is it?", "Which shape is shown?", "What kind of shape is this?", "Name the shape.",
        "what shape?", "What is the shape of the {colour} object?", "Which shape is in the picture?",
        "What shape do you see?", "Tell me the shape of the object.",
    ),
    "position": (
        "Where is the shape?", "Where is the {colour} {shape}?", "Which side is the object on?",
        "Is the shape on the left, in the middle or on the right?", "where is it?",
        "In which part of the image is the shape?", "Where is the object?",
    ),
    "count": (
        "How many shapes are there?", "How many objects are there?", "Count the shapes.", "how many shapes?",
        "How many shapes can you see?", "What is the number of objects?", "How many objects do you see?",
    ),
}
HELD_OUT_WORDINGS = {
    "colour": ("Could you say what colour the object is?", "Colour of the shape?", "What colour is the thing in the picture?"),
    "shape": ("Could you say what shape the object is?", "Shape of the object?", "What geometric figure is drawn?"),
    "position": ("Could you say where the object is?", "On which side of the picture is the shape?"),
    "count": ("Could you count the objects?", "How many things are in the picture?", "Number of shapes?"),
}
KINDS = tuple(WORDINGS)


def column_of(x: float) -> str:
    """The position answer of a centre at ``x`` px: the third of the frame it lies in."""
    return "left" if x < THIRDS[0] else "middle" if x < THIRDS[1] else "right"


def side_px_range(fraction: tuple[float, float]) -> tuple[int, int]:
    """The whole-pixel sides (lo, hi: hi excluded) whose fraction of the frame lies in [fraction[0], fraction[1])."""
    return int(np.ceil(fraction[0] * SIZE)), int(np.ceil(fraction[1] * SIZE))


def draw_side(rng: np.random.Generator, held_out: bool, most: float = SIZE_RANGE[1]) -> int:
    """A shape's side in px: from HELD_OUT_SIZES if ``held_out``, else from SIZE_RANGE up to ``most`` with the
    held-out band left out (uniform over the whole-pixel sides that remain)."""
    band = side_px_range(HELD_OUT_SIZES)
    if held_out:
        return int(rng.integers(*band))
    lo, hi = side_px_range((SIZE_RANGE[0], most))
    allowed = [v for v in range(lo, hi + 1) if not band[0] <= v < band[1]]
    return int(allowed[int(rng.integers(len(allowed)))])


def place(rng: np.random.Generator, sides_px: list[int], tries: int = 200) -> list[tuple[int, int]] | None:
    """Centres for shapes of these sides inside the frame, their boxes apart by at least 4 px, no centre
    within POSITION_MARGIN of a thirds border; None if none found in ``tries``."""
    for _ in range(tries):
        centres = []
        for side in sides_px:
            half = side / 2
            x = int(rng.integers(int(np.ceil(half)), int(SIZE - half) + 1))
            y = int(rng.integers(int(np.ceil(half)), int(SIZE - half) + 1))
            if min(abs(x - t) for t in THIRDS) < POSITION_MARGIN:
                break
            if any(abs(x - cx) < (side + s) / 2 + 4 and abs(y - cy) < (side + s) / 2 + 4
                   for (cx, cy), s in zip(centres, sides_px)):
                break
            centres.append((x, y))
        if len(centres) == len(sides_px):
            return centres
    return None


def fill_template(template: str, colour: str, shape: str) -> str:
    return template.format(colour=colour, shape=shape)


def with_letter_options(example, values: tuple[str, ...], rng: np.random.Generator, n: int | None = None):
    """``example`` as a multiple-choice question in the node's letter format: 2 to all of ``values``
    (``n`` if given), the right one among them, in a random order; the answer is its letter.

    The prompt the trainer builds from ``options`` is ``ChatVideoLLMAdapter.question_ids(question, options)``
    (tests/unit/test_tiny_vlm_variety.py checks they agree token for token)."""
    others = [v for v in values if v != example.answer]
    k = n if n is not None else int(rng.integers(2, len(values) + 1))
    picked = [example.answer] + [others[i] for i in rng.permutation(len(others))[: k - 1]]
    options = tuple(picked[i] for i in rng.permutation(len(picked)))
    return replace(example, options=options, answer=OPTION_LETTERS[options.index(example.answer)])


# Answers a multiple-choice question of each kind picks its options from.
OPTION_VALUES = {
    "colour": tuple(COLOURS), "shape": SHAPES, "position": ("left", "middle", "right"), "count": COUNT_WORDS[1:],
    "first": tuple(COLOURS), "last": tuple(COLOURS), "motion": ("left", "right"), "digit": tuple("0123456789"),
}


class VariedSampler:
    """Scenes of free shapes on varied backgrounds, and questions about them in many wordings.

    ``held_out=False`` (training, and the in-distribution evaluation with another seed) draws sizes from
    SIZE_RANGE less HELD_OUT_SIZES, backgrounds from BACKGROUNDS, wordings from WORDINGS; ``held_out=True``
    draws only HELD_OUT_SIZES, HELD_OUT_BACKGROUNDS and HELD_OUT_WORDINGS. ``pool``: as SceneSampler's,
    questions are asked about scenes of a fixed pool drawn first (fewer encoder passes in training).
    """

    def __init__(self, seed: int, held_out: bool = False, pool: int | None = None):
        self.rng = np.random.default_rng([seed, 14])
        self.held_out = held_out
        self.wordings = HELD_OUT_WORDINGS if held_out else WORDINGS
        self._pools = None
        if pool is not None:
            self._pools = {"single": [self._fresh(1) for _ in range(max(1, int(pool * 0.6)))],
                           "several": [self._fresh(None) for _ in range(max(1, int(pool * 0.4)))]}

    def _fresh(self, n: int | None) -> Scene:
        """A scene of ``n`` free shapes (None: 1 to 3), boxes apart, on a drawn look."""
        rng = self.rng
        n = int(rng.integers(1, 4)) if n is None else n
        while True:
            sides = [draw_side(rng, self.held_out, MAX_SIZE_FOR_COUNT[n]) for _ in range(n)]
            centres = place(rng, sides)
            if centres is not None:
                break
        shapes = tuple(Shape(str(COLOURS_LIST[int(rng.integers(4))]), str(SHAPES[int(rng.integers(3))]), column_of(x),
                             x=x, y=y, side=side) for (x, y), side in zip(centres, sides))
        return Scene(shapes, seed=int(rng.integers(2**31)), look=draw_look(rng, self.held_out))

    def scene(self, several: bool) -> Scene:
        if self._pools is None:
            return self._fresh(None if several else 1)
        pool = self._pools["several" if several else "single"]
        return pool[int(self.rng.integers(len(pool)))]

    def question(self, kind: str | None = None) -> Example:
        """A question of ``kind`` (None: any of KINDS): colour, shape and position of a one-shape scene,
        the count of a 1-3 shape scene."""
        rng = self.rng
        kind = kind or KINDS[int(rng.integers(len(KINDS)))]
        scene = self.scene(several=kind == "count")
        s = scene.shapes[0]
        templates = self.wordings[kind]
        question = fill_template(templates[int(rng.integers(len(templates)))], s.colour, s.shape)
        answer = {"colour": s.colour, "shape": s.shape, "position": s.column, "count": COUNT_WORDS[len(scene.shapes)]}[kind]
        return Example((scene,), question, answer, kind)


COLOURS_LIST = tuple(COLOURS)
