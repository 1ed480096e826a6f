"""Real things ``videokv-tiny`` is asked about and was never trained on (issue 34): the held-out items.

Each is a real photograph or clip the platform ships, never cropped for training (``tinyvlm/things.py``:
``TRAIN_PHOTOS``, ``TRAIN_CLIPS``; scikit-image's ``PHOTOS`` of v1-v4; tests/unit/test_things.py checks
that none meet, stereo twins included), with its truth written by hand from what it shows: the nouns a
person would accept, the first the one they would say. Never the encoder's output: whether the truth is
among the encoder's top-5 nouns is measured by the bench (its ceiling row), not assumed.

Left out on purpose: scikit-image's ``motorcycle_right.png`` (the stereo twin of ``motorcycle_left.png``,
trained on since v1), ``aloeL.jpg`` (a potted aloe; its stereo twin ``aloeR.jpg`` is in v5's training
photos), ``basketball2.png`` (``basketball1.png``'s twin is trained on), scikit-image's photos (trained on
since v1), ``cup.mp4``/``box.mp4`` (opencv-doc ships them gzipped outside ``examples/data``, which the
repository's setup does not unpack).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from videokv_node.eval.footage import view


@dataclass(frozen=True, slots=True)
class HeldOutThing:
    source: str  # tinyvlm.things.real_image key: opencv:<photo>, skimage:<photo>, or clip:<clip> (the whole clip)
    truth: tuple[str, ...]  # nouns a person accepts for it, by hand; the first the one they would say
    what: str  # what it shows, by hand


HELD_OUT_THINGS = (
    HeldOutThing("opencv:apple.jpg", ("apple", "fruit"), "one red apple on a table"),
    HeldOutThing("opencv:orange.jpg", ("orange", "fruit"), "one orange on a table"),
    HeldOutThing("opencv:fruits.jpg", ("orange", "lemon", "lime", "kiwi", "fruit"),
                 "halved oranges, lemons, a lime and a kiwi, close up"),
    HeldOutThing("opencv:baboon.jpg", ("monkey", "baboon", "mandrill"), "a mandrill's face"),
    HeldOutThing("opencv:butterfly.jpg", ("butterfly",), "a black and white butterfly on a leaf"),
    HeldOutThing("opencv:squirrel_cls.jpg", ("squirrel",), "a squirrel on a branch"),
    HeldOutThing("opencv:chicky_512.png", ("dog", "puppy"), "a small long-haired dog's face"),
    HeldOutThing("opencv:licenseplate_motion.jpg", ("car",), "the back of a silver car, motion blurred"),
    HeldOutThing("opencv:messi5.jpg", ("football", "ball", "player", "footballer", "person", "man"),
                 "a footballer kicking a ball in a stadium"),
    HeldOutThing("opencv:sudoku.png", ("sudoku", "crossword", "puzzle", "newspaper"), "a sudoku printed in a newspaper"),
    HeldOutThing("clip:carphone_pristine.mp4", ("man", "person", "bow tie", "tie", "suit"),
                 "a man in a suit and bow tie talking in a car"),
    HeldOutThing("clip:bigbuckbunny.mp4", ("rabbit", "bunny"), "a cartoon rabbit in a meadow"),
)


def held_out_items(sources: list[str] | tuple[str, ...], what: str = "things") -> list[HeldOutThing]:
    """The held-out items of ``sources``, in that order; ValueError naming the unknown ones (as ``what``) and the
    known sources."""
    by_source = {item.source: item for item in HELD_OUT_THINGS}
    unknown = [s for s in sources if s not in by_source]
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; known: {sorted(by_source)}")
    return [by_source[s] for s in sources]


PAN_FRAMES = 8  # frames of a held-out item's slow pan
PAN_SIZE = (320, 240)  # (width, height) of a pan's frames, a small camera's


def thing_frames(item: HeldOutThing, n: int = PAN_FRAMES, size: tuple[int, int] = PAN_SIZE) -> list[np.ndarray]:
    """A held-out item as a camera sees it: a photograph as a slow pan (a window 1.25x narrower than the widest
    that fits, its centre moving from 0.35 to 0.65 of the width), a clip as ``n`` frames sampled evenly."""
    from videokv_node.tinyvlm.things import clip_frames, real_image

    if item.source.startswith("clip:"):
        frames = clip_frames(item.source.removeprefix("clip:"))
        picked = [frames[i] for i in np.linspace(0, len(frames) - 1, n).astype(int)]
        return [view(f, 0.5, 0.5, 1.0, size) for f in picked]
    image = real_image(item.source)
    return [view(image, float(cx), 0.5, 1.25, size) for cx in np.linspace(0.35, 0.65, n)]
