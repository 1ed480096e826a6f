"""How a varied frame (``tinyvlm/variety.py``) is lit and filmed: its backdrop, gain, colour cast, blur, noise.

Backdrops drawn in training (``BACKGROUNDS``) and only by the held-out evaluation
(``HELD_OUT_BACKGROUNDS``, with crops of ``HELD_OUT_PHOTOS``); lighting and blur are drawn from
the same ranges in both. Our choice: backgrounds are unsaturated (greys, tints of at most +-24
per channel, photos): a saturated backdrop of a shape's own hue would make "what colour is the
shape" ill-posed, and a camera's backgrounds are mostly unsaturated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFilter

from videokv_node.tinyvlm.scenes import PHOTOS, SIZE, photo_dir

# --- backgrounds ---------------------------------------------------------------------------------------
BACKGROUNDS = ("flat", "gradient", "noise", "stripes", "photo")  # drawn in training
HELD_OUT_BACKGROUNDS = ("radial", "checker", "blobs", "unseen photo")  # drawn only by the held-out evaluation
# scikit-image photos never used in training (neither as backgrounds nor as photo questions): grey textures
HELD_OUT_PHOTOS = ("gravel.png", "cell.png", "page.png", "clock_motion.png")

# --- lighting and blur, the same in training and held out -------------------------------------------------
GAIN_RANGE = (0.6, 1.3)  # overall brightness factor
CAST = 0.08  # per-channel factor of 1 +- CAST (a white balance off)
BLUR_SHARE = 0.5  # share of frames blurred ...
BLUR_RANGE = (0.5, 3.0)  # ... by a Gaussian of this radius, px
NOISE_RANGE = (0.0, 8.0)  # sensor noise, standard deviation in grey levels

@dataclass(frozen=True, slots=True)
class Look:
    """How a varied frame is lit and filmed; the parameters a kind needs (tones, angle, period, crop)
    are drawn from the scene's seed when it is rendered."""

    background: str  # one of BACKGROUNDS or HELD_OUT_BACKGROUNDS
    gain: float = 1.0  # brightness factor
    cast: tuple[float, float, float] = (1.0, 1.0, 1.0)  # per-channel factors
    blur: float = 0.0  # Gaussian radius, px (0: sharp)
    noise: float = 0.0  # sensor noise, grey levels


def _tone(rng: np.random.Generator, lo: int = 0, hi: int = 255) -> np.ndarray:
    """An unsaturated colour: a grey level with a tint of at most +-24 per channel."""
    return np.clip(rng.uniform(lo, hi) + rng.uniform(-24, 24, 3), 0, 255)


def _two_tones(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    a = _tone(rng)
    b = np.clip(a + rng.choice((-1, 1)) * rng.uniform(30, 120) + rng.uniform(-24, 24, 3), 0, 255)
    return a, b


def _grid() -> tuple[np.ndarray, np.ndarray]:
    return np.meshgrid(np.arange(SIZE, dtype=np.float32), np.arange(SIZE, dtype=np.float32))  # (x, y), each (S, S)


def _photo_crop(file: str, rng: np.random.Generator) -> np.ndarray:
    img = Image.open(photo_dir() / file).convert("RGB")
    w, h = img.size
    side = int(min(w, h) * rng.uniform(0.4, 1.0))
    left, top = int(rng.integers(0, w - side + 1)), int(rng.integers(0, h - side + 1))
    crop = img.crop((left, top, left + side, top + side)).resize((SIZE, SIZE), Image.BILINEAR)
    return np.asarray(crop, dtype=np.float32)


def background(kind: str, rng: np.random.Generator) -> np.ndarray:
    """(S, S, 3) float32 backdrop of ``kind``, its parameters drawn from ``rng``."""
    x, y = _grid()
    if kind == "flat":
        return np.broadcast_to(_tone(rng), (SIZE, SIZE, 3)).astype(np.float32)
    if kind in ("gradient", "radial"):
        a, b = _two_tones(rng)
        if kind == "gradient":
            angle = rng.uniform(0, 2 * np.pi)
            t = (x - SIZE / 2) * np.cos(angle) + (y - SIZE / 2) * np.sin(angle)
        else:
            cx, cy = rng.uniform(0, SIZE, 2)
            t = np.hypot(x - cx, y - cy)
        t = (t - t.min()) / max(1e-6, float(t.max() - t.min()))
        return (a + (b - a) * t[..., None]).astype(np.float32)
    if kind == "noise":  # fine grain, 1-4 px
        scale = int(rng.choice((1, 2, 4)))
        base, sd = rng.uniform(40, 215), rng.uniform(10, 45)
        grain = rng.normal(0, sd, (SIZE // scale, SIZE // scale, 1)).repeat(scale, 0).repeat(scale, 1)
        return np.clip(base + rng.uniform(-24, 24, 3) + grain, 0, 255).astype(np.float32)
    if kind == "blobs":  # low frequency, 28-56 px: unlike anything in training
        cells = int(rng.integers(4, 9))
        coarse = Image.fromarray(rng.uniform(0, 255, (cells, cells)).astype(np.uint8)).resize((SIZE, SIZE), Image.BICUBIC)
        v = np.asarray(coarse, dtype=np.float32)[..., None] * rng.uniform(0.3, 0.8)
        return np.clip(v + rng.uniform(20, 100) + rng.uniform(-24, 24, 3), 0, 255).astype(np.float32)
    if kind in ("stripes", "checker"):
        a, b = _two_tones(rng)
        period = rng.uniform(6, 40)
        if kind == "stripes":
            angle = rng.uniform(0, np.pi)
            on = np.floor(((x * np.cos(angle) + y * np.sin(angle)) / period)) % 2 == 0
        else:
            on = (np.floor(x / period) + np.floor(y / period)) % 2 == 0
        return np.where(on[..., None], a, b).astype(np.float32)
    if kind == "photo":
        return _photo_crop(PHOTOS[int(rng.integers(len(PHOTOS)))].file, rng)
    if kind == "unseen photo":
        return _photo_crop(HELD_OUT_PHOTOS[int(rng.integers(len(HELD_OUT_PHOTOS)))], rng)
    raise ValueError(f"unknown background {kind!r}")


def film(img: Image.Image, look: Look, rng: np.random.Generator) -> np.ndarray:
    """The drawn frame as a camera gives it: gain and colour cast, blur, sensor noise; (S, S, 3) uint8."""
    if look.blur > 0:
        img = img.filter(ImageFilter.GaussianBlur(look.blur))
    x = np.asarray(img, dtype=np.float32) * look.gain * np.asarray(look.cast, dtype=np.float32)
    if look.noise > 0:
        x = x + rng.normal(0, look.noise, x.shape)
    return np.clip(np.rint(x), 0, 255).astype(np.uint8)


def draw_look(rng: np.random.Generator, held_out: bool) -> Look:
    kinds = HELD_OUT_BACKGROUNDS if held_out else BACKGROUNDS
    blur = float(rng.uniform(*BLUR_RANGE)) if rng.random() < BLUR_SHARE else 0.0
    return Look(str(kinds[int(rng.integers(len(kinds)))]), gain=float(rng.uniform(*GAIN_RANGE)),
                cast=tuple(float(c) for c in 1 + rng.uniform(-CAST, CAST, 3)), blur=blur,
                noise=float(rng.uniform(*NOISE_RANGE)))
