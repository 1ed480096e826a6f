"""Generalisation of ``videokv-tiny`` (issue 14): renders and wordings training never draws, and another renderer.

Two sets of free-shape questions (``generalisation_examples``): held out, only what
``tinyvlm.variety``'s training sampler never draws (shape sides of HELD_OUT_SIZES of the frame,
backgrounds ``looks.HELD_OUT_BACKGROUNDS`` with crops of ``looks.HELD_OUT_PHOTOS``, the
HELD_OUT_WORDINGS of every kind; tests/unit/test_tiny_vlm_variety.py), and in distribution
(training's distributions, a seed training never uses). Plain coloured discs drawn by another
renderer (``disc_frames``). Each answered through the engine (``full``), open and by option.
"""

from __future__ import annotations

from collections import defaultdict

from videokv_node.tinyvlm.engine_answers import SCORINGS, full_memory, scored_answers
from videokv_node.tinyvlm.render import render
from videokv_node.tinyvlm.scenes import Example
from videokv_node.tinyvlm.variety import KINDS, OPTION_VALUES, VariedSampler

GENERALISATION_SEED = 2_000_029  # the in-distribution set: training's distributions, a seed training never uses


def generalisation_examples(per_kind: int, held_out: bool, seed: int = GENERALISATION_SEED) -> list[Example]:
    """``per_kind`` fresh questions of each of KINDS (colour, shape, position, count) about free-shape scenes:
    held out (HELD_OUT_SIZES, HELD_OUT_BACKGROUNDS, HELD_OUT_WORDINGS only) or in distribution (training's
    sizes, backgrounds and wordings, from a seed training never uses)."""
    sampler = VariedSampler(seed, held_out=held_out)
    return [sampler.question(kind) for kind in KINDS for _ in range(per_kind)]


def choice_accuracy(adapter, examples: list[Example], seed: int = 0) -> dict[str, dict[str, float]]:
    """{kind: {"examples": n, "open"|"likelihood"|"letter": accuracy}} through the engine (``full``); the options
    are every value of the kind (OPTION_VALUES) in an order drawn from ``seed``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    hits = defaultdict(lambda: defaultdict(list))
    for ex in examples:
        values = list(OPTION_VALUES[ex.kind])
        options = [values[i] for i in rng.permutation(len(values))]
        got = scored_answers(adapter, [render(s) for s in ex.scenes], ex.question, ex.answer, options, full_memory(adapter))
        for scoring, ok in got.items():
            hits[ex.kind][scoring].append(ok)
    return {k: {"examples": len(v["open"]), **{sc: sum(v[sc]) / len(v[sc]) for sc in SCORINGS}} for k, v in hits.items()}


# Plain coloured discs by another renderer (issue 14's report: open 3/4, multiple choice 0/4 on the v2 model):
# numpy, anti-aliased, 320 x 240 frames (the adapter resizes), pure colours unlike the training palette's,
# radius 40-110 px anywhere in the frame, a new place in each of DISC_FRAMES frames.
DISC_COLOURS = {"red": (255, 0, 0), "green": (0, 200, 0), "blue": (0, 0, 255), "yellow": (255, 230, 0)}
DISC_FRAMES = 6
DISC_QUESTION = "What colour is the disc?"


def disc_frames(colour: str, seed: int, n: int = DISC_FRAMES) -> list:
    """``n`` (240, 320, 3) uint8 frames of one plain disc of ``colour`` on a plain light background."""
    import numpy as np

    rng = np.random.default_rng(seed)
    h, w = 240, 320
    bg = rng.uniform(200, 255)
    r = rng.uniform(40, 110)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    out = []
    for _ in range(n):
        cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
        cover = np.clip(r + 0.5 - np.hypot(xx - cx, yy - cy), 0, 1)[..., None]  # anti-aliased edge
        out.append(np.rint(bg * (1 - cover) + np.asarray(DISC_COLOURS[colour]) * cover).astype(np.uint8))
    return out


def disc_accuracy(adapter, per_colour: int = 2, seed: int = 77) -> dict[str, float]:
    """{"examples": n, scoring: accuracy} on DISC_QUESTION over streams of DISC_FRAMES disc frames (``full``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    hits = defaultdict(list)
    for colour in DISC_COLOURS:
        for _ in range(per_colour):
            options = [list(DISC_COLOURS)[i] for i in rng.permutation(len(DISC_COLOURS))]
            got = scored_answers(adapter, disc_frames(colour, int(rng.integers(2**31))), DISC_QUESTION, colour, options,
                                 full_memory(adapter))
            for scoring, ok in got.items():
                hits[scoring].append(ok)
    return {"examples": len(hits["open"]), **{sc: sum(v) / len(v) for sc, v in hits.items()}}
