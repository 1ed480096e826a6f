"""The pixels of a scene (``scenes.Scene``): its shapes or digit drawn on its backdrop, or a crop of its photo.

The same scene always gives the same pixels: every jitter (size, exact position, tints, a photo's
crop and flip, a varied look's parameters) is drawn from the scene's own seed.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from videokv_node.tinyvlm.looks import background, film
from videokv_node.tinyvlm.scenes import COLOURS, COLUMNS, PHOTOS, SIZE, Scene, photo_dir

FONT_FILE = "DejaVuSans-Bold.ttf"
MIN_CROP = 0.6  # smallest crop side, as a fraction of the photo's shorter side


@lru_cache(maxsize=128)
def photo_image(file: str) -> Image.Image:
    """A real picture, as RGB (read once): one of PHOTOS by its file name, or (v5, ``tinyvlm/things.py``) one of
    opencv-doc's photographs as ``opencv:<file>`` or a frame of a clip as ``clip:<clip>:<index>``
    (``things.real_image``)."""
    if ":" in file:
        from videokv_node.tinyvlm.things import real_image

        return Image.fromarray(real_image(file))
    return Image.open(photo_dir() / file).convert("RGB")


def _font(size: int):
    try:
        return ImageFont.truetype(FONT_FILE, size)
    except OSError:  # no DejaVu on this machine: Pillow's own scalable font (Pillow >= 10.1)
        return ImageFont.load_default(size)


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, colour: str, x: float, y: float, r: float,
               rng: np.random.Generator) -> None:
    """A filled ``shape`` (circle, square, triangle) of half-side ``r`` centred at (x, y), in ``colour`` with each
    channel jittered by up to 20 grey levels (three draws of ``rng``)."""
    fill = tuple(int(np.clip(c + rng.integers(-20, 21), 0, 255)) for c in COLOURS[colour])
    if shape == "circle":
        draw.ellipse((x - r, y - r, x + r, y + r), fill=fill)
    elif shape == "square":
        draw.rectangle((x - r, y - r, x + r, y + r), fill=fill)
    else:
        draw.polygon(((x, y - r), (x - r, y + r), (x + r, y + r)), fill=fill)


def render(scene: Scene) -> np.ndarray:
    """(224, 224, 3) uint8 RGB picture of ``scene``; the same scene always gives the same pixels."""
    rng = np.random.default_rng(scene.seed)
    if scene.photo is not None:
        img = photo_image(scene.photo)
        w, h = img.size
        side = int(min(w, h) * rng.uniform(MIN_CROP, 1.0))
        left, top = int(rng.integers(0, w - side + 1)), int(rng.integers(0, h - side + 1))
        crop = img.crop((left, top, left + side, top + side)).resize((SIZE, SIZE), Image.BILINEAR)
        if rng.random() < 0.5:
            crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
        return np.asarray(crop).copy()
    if scene.look is None:
        bg = tuple(int(v) for v in 235 + rng.integers(-15, 16, 3))
        img = Image.new("RGB", (SIZE, SIZE), bg)
    else:
        img = Image.fromarray(np.clip(np.rint(background(scene.look.background, rng)), 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for s in scene.shapes:
        if s.x is None:
            r = int(rng.integers(20, 31))
            x = COLUMNS[s.column] + int(rng.integers(-6, 7))
            y = 112 + int(rng.integers(-60, 61))
        else:
            r, x, y = s.side / 2, s.x, s.y
        draw_shape(draw, s.shape, s.colour, x, y, r, rng)
    if scene.digit is not None:
        size = int(rng.integers(110, 151))
        ink = tuple(int(v) for v in rng.integers(0, 60, 3))
        x, y = 112 + int(rng.integers(-25, 26)), 112 + int(rng.integers(-25, 26))
        draw.text((x, y), scene.digit, fill=ink, font=_font(size), anchor="mm")
    if scene.look is not None:
        return film(img, scene.look, rng)
    return np.asarray(img).copy()
