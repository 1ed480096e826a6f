"""The memory at a glance: small thumbnails of sampled frames (``Thumbnails``) and the contact sheet of the
frames in memory drawn from them (``render_sheet``), newest first, each with its stamp, span and words. No ROS.

A thumbnail is taken when a frame is sampled (a strided pick of its pixels: no filtering, microseconds),
kept raw within a byte cap, and encoded only when a sheet is drawn, so the camera path pays no JPEG.
"""

from __future__ import annotations

import io
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from videokv_node.node_settings import SheetSettings
from videokv_node.view.memory_view import OFFLOADED, FrameView, MemoryView

TEXT_LINES = 3  # stamp | span and tier | words
LINE_PX = 11
PAD_PX = 2
MIN_QUALITY = 20
BACKGROUND = (24, 24, 24)
TIER_MARK = {OFFLOADED: "host"}  # resident frames carry no mark


def thumbnail(rgb: np.ndarray, width: int) -> np.ndarray:
    """(H, W, 3) uint8 -> (h, width', 3) uint8, a strided (nearest) pick, aspect kept; never wider than the frame."""
    h, w = rgb.shape[:2]
    out_w = max(1, min(width, w))
    out_h = max(1, round(h * out_w / w))
    rows = (np.arange(out_h) * h // out_h).clip(0, h - 1)
    cols = (np.arange(out_w) * w // out_w).clip(0, w - 1)
    return np.ascontiguousarray(rgb[rows][:, cols, :3])


class Thumbnails:
    """Thumbnails by (camera, stamp), at most ``capacity_bytes`` of pixels, the oldest added dropped first; thread-safe.

    Invariants after every call: ``bytes`` is the sum of the thumbnails' sizes and never exceeds the cap; a
    thumbnail larger than the whole cap is not kept. Camera callbacks add, the sheet's timer reads and prunes.
    """

    def __init__(self, capacity_bytes: int, width: int) -> None:
        self.capacity_bytes = capacity_bytes  # set once (sheet.thumbnail_bytes)
        self.width = width  # set once (sheet.thumbnail_width)
        self._items: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()  # oldest added first
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def bytes(self) -> int:
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def add(self, camera: str, stamp_ns: int, rgb: np.ndarray) -> None:
        """Keep a thumbnail of a sampled frame, making room by dropping the oldest."""
        thumb = thumbnail(rgb, self.width)
        if thumb.nbytes > self.capacity_bytes:
            return
        with self._lock:
            old = self._items.pop((camera, stamp_ns), None)
            self._bytes -= 0 if old is None else old.nbytes
            while self._items and self._bytes + thumb.nbytes > self.capacity_bytes:
                self._bytes -= self._items.popitem(last=False)[1].nbytes
            self._items[(camera, stamp_ns)] = thumb
            self._bytes += thumb.nbytes

    def get(self, camera: str, stamp_ns: int) -> np.ndarray | None:
        with self._lock:
            return self._items.get((camera, stamp_ns))

    def prune(self, view: MemoryView) -> None:
        """Drop the thumbnails of frames the memory no longer holds (those up to its newest stamp and not in it);
        newer ones may still be on their way to the model."""
        keep = {(f.camera, s) for f in view.frames for s in f.stamps_ns}
        newest = view.span_ns[1]
        with self._lock:
            for key in [k for k in self._items if k[1] <= newest and k not in keep]:
                self._bytes -= self._items.pop(key).nbytes


@dataclass(frozen=True, slots=True)
class Sheet:
    """A contact sheet, encoded: ``frames`` of the memory's frames shown on it, in ``len(jpeg)`` bytes."""

    jpeg: bytes
    frames: int
    quality: int


def caption(f: FrameView, newest_ns: int) -> tuple[str, str, str]:
    """The three lines under a thumbnail: its age (seconds before the newest frame held) and stamp (UTC time of day),
    its still span and where its KV lives, its words."""
    # Age first, then the stamp's UTC time of day: a thumbnail's line holds about 16 characters (epoch seconds took them all)
    stamp = f"-{(newest_ns - f.stamp_ns) / 1e9:.1f} s {time.strftime('%H:%M:%S', time.gmtime(f.stamp_ns // 1_000_000_000))}"
    span = f"still {(f.span_end_ns - f.stamps_ns[-1]) / 1e9:.1f} s" if f.span_end_ns else ""
    if len(f.stamps_ns) > 1:
        span = f"{len(f.stamps_ns)} frames " + span
    tier = TIER_MARK.get(f.tier, "")
    return stamp, " ".join(x for x in (span, tier) if x), ", ".join(f.words)


def shown(view: MemoryView, thumbs: Thumbnails, limit: int) -> list[tuple[FrameView, np.ndarray]]:
    """The frames the sheet shows, newest first, at most ``limit``: those with a thumbnail (of their newest stamp
    that has one)."""
    out = []
    for f in sorted(view.frames, key=lambda f: (f.stamps_ns[-1], f.block_id), reverse=True):
        thumb = next((t for t in (thumbs.get(f.camera, s) for s in reversed(f.stamps_ns)) if t is not None), None)
        if thumb is not None:
            out.append((f, thumb))
            if len(out) == limit:
                break
    return out


def _draw(tiles: list[tuple[FrameView, np.ndarray]], newest_ns: int, s: SheetSettings) -> Image.Image:
    tile_w = s.thumbnail_width + 2 * PAD_PX
    thumb_h = max(t.shape[0] for _, t in tiles)
    tile_h = thumb_h + TEXT_LINES * LINE_PX + 2 * PAD_PX
    columns = min(s.columns, len(tiles))
    rows = -(-len(tiles) // columns)
    sheet = Image.new("RGB", (columns * tile_w, rows * tile_h), BACKGROUND)
    draw, font = ImageDraw.Draw(sheet), ImageFont.load_default()
    chars = max(4, s.thumbnail_width // 6)  # the default font is about 6 px a character
    for i, (f, thumb) in enumerate(tiles):
        x, y = (i % columns) * tile_w + PAD_PX, (i // columns) * tile_h + PAD_PX
        sheet.paste(Image.fromarray(thumb), (x, y))
        for k, line in enumerate(caption(f, newest_ns)):
            draw.text((x, y + thumb_h + k * LINE_PX), line[:chars], fill=(230, 230, 230), font=font)
    return sheet


def render_sheet(view: MemoryView, thumbs: Thumbnails, s: SheetSettings) -> Sheet | None:
    """The contact sheet of ``view`` as JPEG within ``s.max_bytes``: the quality is lowered first (to
    ``MIN_QUALITY``), then the oldest frames are left off. None where no frame in memory has a thumbnail."""
    tiles = shown(view, thumbs, s.max_frames)
    newest = view.span_ns[1]
    while tiles:
        image = _draw(tiles, newest, s)
        for quality in sorted({s.quality, max(MIN_QUALITY, s.quality // 2), MIN_QUALITY}, reverse=True):
            if quality > s.quality:
                continue
            buf = io.BytesIO()
            image.save(buf, format="JPEG", quality=quality)
            if buf.tell() <= s.max_bytes:
                return Sheet(buf.getvalue(), len(tiles), quality)
        tiles = tiles[:len(tiles) * 3 // 4]  # still too large: leave off the oldest quarter
    return None
