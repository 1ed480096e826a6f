"""Turn the plain fields of sensor_msgs/Image and CompressedImage into RGB frames.

The library never imports ROS (cv_bridge would also drag in OpenCV), so the node
passes ``msg.encoding``, ``msg.width``, ... and gets back a frame it may keep.

Invariants of every decoder:
- the result is an (H, W, 3) uint8 RGB array, C-contiguous, that owns its memory:
  it never aliases ``data`` (rclpy may reuse a message buffer while a worker
  thread still holds the frame);
- bad input raises :class:`ImageDecodeError` with a stable ``reason`` token, never
  a half-decoded frame (a grey half-frame in memory is worse than a dropped one).

The YUV 4:2:2 decoders are the integer BT.601 (limited range) arithmetic of
OpenCV's ``cvtColor(..., COLOR_YUV2RGB_UYVY / _YUY2)``, which cv_bridge uses, so a
frame decodes to the same bytes here as in a C++ node.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageFile


class ImageDecodeError(ValueError):
    """A message that cannot become an RGB frame.

    ``reason`` is a short stable token (``zero_size``, ``unsupported_encoding``,
    ``bad_step``, ``short_data``, ``odd_width``, ``unsupported_format``,
    ``corrupt_compressed``, ``too_large``) for counters and per-reason throttled
    logs; the message says what was wrong in words.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self):  # keep ``reason`` across pickling (worker processes)
        return (type(self), (self.reason, str(self)))


# Bytes per pixel of each supported encoding (names of sensor_msgs/image_encodings.hpp;
# "yuv422" is UYVY and "yuv422_yuy2" is YUYV there, "uyvy"/"yuyv" are the newer aliases).
_BYTES_PER_PIXEL = {
    "rgb8": 3, "bgr8": 3, "rgba8": 4, "bgra8": 4, "mono8": 1, "mono16": 2,
    "yuv422": 2, "uyvy": 2, "yuv422_yuy2": 2, "yuyv": 2,
}
SUPPORTED_ENCODINGS: tuple[str, ...] = tuple(_BYTES_PER_PIXEL)
_UYVY = ("yuv422", "uyvy")
_YUYV = ("yuv422_yuy2", "yuyv")
_YUV = _UYVY + _YUYV
DEFAULT_MAX_PIXELS = 64_000_000

# OpenCV's fixed-point BT.601 constants (modules/imgproc/src/color_yuv.simd.hpp), Q20.
_CY, _CUB, _CUG, _CVG, _CVR, _SHIFT = 1220542, 2116026, -409993, -852492, 1673527, 20


def _as_bytes_array(data) -> np.ndarray:
    """A flat uint8 view of any buffer rclpy may hand us (bytes, array.array('B'), ...)."""
    try:
        view = memoryview(data)
    except TypeError:
        raise TypeError(f"image data must be a bytes-like buffer, got {type(data).__name__}") from None
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return np.frombuffer(view, dtype=np.uint8)


def _yuv422_to_rgb(rows: np.ndarray, width: int, uyvy: bool) -> np.ndarray:
    """(H, 2W) packed 4:2:2 bytes -> (H, W, 3) RGB, bit-exact with OpenCV."""
    quads = rows.reshape(rows.shape[0], width // 2, 4).astype(np.int32)  # (H, W/2, 4)
    u, y0, v, y1 = (quads[..., k] for k in ((0, 1, 2, 3) if uyvy else (1, 0, 3, 2)))  # UYVY / YUYV
    y = np.stack([y0, y1], axis=-1).reshape(rows.shape[0], width)  # (H, W)
    y = np.maximum(y - 16, 0) * _CY
    u = np.repeat(u - 128, 2, axis=1)  # (H, W): one chroma sample serves a pixel pair
    v = np.repeat(v - 128, 2, axis=1)
    half = 1 << (_SHIFT - 1)
    r = (y + _CVR * v + half) >> _SHIFT  # int32 is enough: |terms| < 2**30
    g = (y + _CVG * v + _CUG * u + half) >> _SHIFT
    b = (y + _CUB * u + half) >> _SHIFT
    return np.clip(np.stack([r, g, b], axis=-1), 0, 255).astype(np.uint8)


def _rows_to_rgb(enc: str, rows: np.ndarray, width: int, big: bool) -> np.ndarray:
    """(H, W*bpp) bytes of one encoding -> (H, W, 3) RGB, possibly a view of ``rows``."""
    h = rows.shape[0]
    if enc in _YUV:
        return _yuv422_to_rgb(rows, width, uyvy=enc in _UYVY)
    if enc == "mono16":
        grey = (rows.view(">u2" if big else "<u2") >> 8).astype(np.uint8)  # (H, W), 16 -> 8 bit
        return np.repeat(grey[:, :, None], 3, axis=2)
    if enc == "mono8":
        return np.repeat(rows[:, :, None], 3, axis=2)
    pix = rows.reshape(h, width, _BYTES_PER_PIXEL[enc])  # (H, W, C)
    return {"rgb8": pix, "bgr8": pix[..., ::-1], "rgba8": pix[..., :3], "bgra8": pix[..., 2::-1]}[enc]


def check_raw_image(encoding: str, width: int, height: int, step: int, data_len: int) -> str:
    """Check sensor_msgs/Image fields without touching a pixel; returns the normalised encoding.

    Reads the sizes, the encoding and ``len(data)`` only (microseconds for any frame),
    so a frame the sampler will skip costs no decode. Every way ``decode_raw_image``
    can refuse a frame is refused here, with the same reason: a raw frame that passes
    always decodes.
    """
    if width <= 0 or height <= 0:
        raise ImageDecodeError("zero_size", f"image is {width}x{height}; width and height must be > 0")
    enc = encoding.strip().lower()
    bpp = _BYTES_PER_PIXEL.get(enc)
    if bpp is None:
        raise ImageDecodeError(
            "unsupported_encoding",
            f"encoding {encoding!r} is not supported; supported: {', '.join(SUPPORTED_ENCODINGS)}",
        )
    if enc in _YUV and width % 2:
        raise ImageDecodeError("odd_width", f"{enc} packs pixel pairs; width {width} is odd")
    row_bytes = width * bpp
    if step < row_bytes:
        raise ImageDecodeError(
            "bad_step", f"step {step} < width {width} * {bpp} bytes per pixel = {row_bytes} for {enc}"
        )
    if data_len < step * height:
        raise ImageDecodeError(
            "short_data", f"expected step * height = {step} * {height} = {step * height} bytes, got {data_len}"
        )
    return enc


def decode_raw_image(
    encoding: str, width: int, height: int, step: int, data, is_bigendian: bool = False
) -> np.ndarray:
    """Decode sensor_msgs/Image fields to an (H, W, 3) uint8 RGB array (a copy).

    ``step`` may exceed ``width * bytes_per_pixel``: the padding at the end of each
    row is ignored. ``data`` may hold more than ``step * height`` bytes; the rest is
    ignored. ``is_bigendian`` only matters for mono16, which is scaled to 8 bit by
    keeping the high byte (v >> 8, so v = 257 * g decodes back to g exactly).
    Alpha is dropped, not composited.
    """
    buf = _as_bytes_array(data)
    enc = check_raw_image(encoding, width, height, step, buf.size)
    row_bytes = width * _BYTES_PER_PIXEL[enc]
    rows = buf[: step * height].reshape(height, step)[:, :row_bytes]  # (H, W*bpp), padding cut
    out = np.ascontiguousarray(_rows_to_rgb(enc, rows, width, bool(is_bigendian)))
    return out.copy() if np.may_share_memory(out, buf) else out


def _check_format(fmt: str) -> None:
    """Refuse a CompressedImage.format that names no colour JPEG/PNG; "" is allowed.

    image_transport writes "<encoding>; <codec> compressed <target encoding>", e.g.
    "bgr8; jpeg compressed bgr8"; plain "jpeg"/"png" is also common.
    """
    words = fmt.lower().replace(";", " ").split()
    codecs = {"jpeg" if w == "jpg" else w for w in words if w in ("jpeg", "jpg", "png")}
    if words and ("compresseddepth" in words or len(codecs) != 1):
        raise ImageDecodeError("unsupported_format", f"format {fmt!r}: only jpeg and png colour images are supported")


def _pil_to_rgb(im: Image.Image) -> np.ndarray:
    """Any loaded Pillow image -> (H, W, 3) uint8 RGB array owning its memory."""
    if im.mode.startswith("I"):  # 16-bit grey PNG: scale like mono16, Pillow's convert would clip
        grey = (np.clip(np.asarray(im).astype(np.int64), 0, 65535) >> 8).astype(np.uint8)  # (H, W)
        return np.repeat(grey[:, :, None], 3, axis=2)
    return np.array(im if im.mode == "RGB" else im.convert("RGB"), dtype=np.uint8)


_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n")  # JPEG SOI + marker, PNG signature


def check_compressed_image(fmt: str, data) -> None:
    """Check sensor_msgs/CompressedImage fields without decompressing: the format names one
    colour JPEG or PNG (or is empty), the data is not empty and starts with a JPEG or PNG
    signature. Reads at most 8 bytes of ``data``.

    What only decompression finds (a truncated or corrupt body, a size over ``max_pixels``)
    is left to ``decode_compressed_image``: a frame that passes here may still fail there.
    """
    _check_format(fmt)
    head = _as_bytes_array(data)[:8].tobytes()
    if not head:
        raise ImageDecodeError("zero_size", "compressed image data is empty")
    if not any(head.startswith(magic) for magic in _MAGIC):
        raise ImageDecodeError("corrupt_compressed", f"{fmt!r} data starts with {head[:4].hex()}, not a JPEG or PNG signature")


def decode_compressed_image(fmt: str, data, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Decode sensor_msgs/CompressedImage fields to an (H, W, 3) uint8 RGB array.

    The bytes decide the codec (JPEG or PNG, as cv_bridge's ``imdecode`` does);
    ``fmt`` is only checked to name one of them (or be empty). Pillow returns RGB,
    and image_transport encodes colour images from bgr8 through OpenCV, so the
    colour order is right whatever ``fmt`` says. The header's size is checked
    against ``max_pixels`` before any pixel is decompressed (decompression bombs).
    The image is fully loaded here: truncated data raises ``corrupt_compressed``.
    """
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise RuntimeError("PIL.ImageFile.LOAD_TRUNCATED_IMAGES was set True in this process; "
                           "truncated frames would be accepted silently")
    buf = _as_bytes_array(data)
    check_compressed_image(fmt, buf)
    try:
        with Image.open(io.BytesIO(buf.data), formats=("JPEG", "PNG")) as im:
            w, h = im.size
            if w * h == 0:
                raise ImageDecodeError("zero_size", f"compressed image is {w}x{h}")
            if w * h > max_pixels:
                raise ImageDecodeError("too_large", f"{w}x{h} = {w * h} pixels > max_pixels {max_pixels}")
            im.load()
            return _pil_to_rgb(im)
    except ImageDecodeError:
        raise
    except Image.DecompressionBombError as e:
        raise ImageDecodeError("too_large", str(e)) from e
    except Image.UnidentifiedImageError as e:
        raise ImageDecodeError("corrupt_compressed", f"{fmt!r} data is not a JPEG or PNG image") from e
    except Exception as e:  # noqa: BLE001 - Pillow raises many types on hostile bytes; a callback must not die
        raise ImageDecodeError("corrupt_compressed", f"cannot decode {fmt!r} image: {e}") from e


def _check_rgb(rgb: np.ndarray) -> np.ndarray:
    if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8 or rgb.ndim != 3 or rgb.shape[2] != 3:
        raise ValueError(f"expected an (H, W, 3) uint8 array, got {getattr(rgb, 'shape', None)} "
                         f"{getattr(rgb, 'dtype', type(rgb).__name__)}")
    if rgb.size == 0:
        raise ValueError(f"cannot encode an empty image of shape {rgb.shape}")
    return np.ascontiguousarray(rgb)


def _luma(rgb: np.ndarray) -> np.ndarray:
    """BT.601 luma, OpenCV's RGB2GRAY fixed point (Q14); exact on grey input."""
    r, g, b = (rgb[..., k].astype(np.int32) for k in range(3))
    return (r * 4899 + g * 9617 + b * 1868 + 8192) >> 14  # (H, W), 0..255


def _rgb_to_yuv422(rgb: np.ndarray, uyvy: bool) -> np.ndarray:
    """(H, W, 3) RGB -> (H, 2W) packed 4:2:2, BT.601 limited range, chroma of each pair averaged."""
    f = rgb.astype(np.float64) / 255.0
    y = 16 + f @ np.array([65.481, 128.553, 24.966])  # (H, W)
    pair = f.reshape(f.shape[0], -1, 2, 3).mean(axis=2)  # (H, W/2, 3)
    u = 128 + pair @ np.array([-37.797, -74.203, 112.0])  # (H, W/2)
    v = 128 + pair @ np.array([112.0, -93.786, -18.214])
    y0, y1 = y[:, 0::2], y[:, 1::2]
    quads = np.stack([u, y0, v, y1] if uyvy else [y0, u, y1, v], axis=-1)  # (H, W/2, 4)
    return np.clip(np.rint(quads), 0, 255).astype(np.uint8).reshape(rgb.shape[0], -1)


def encode_raw_image(rgb: np.ndarray, encoding: str = "rgb8", *, is_bigendian: bool = False,
                     row_padding: int = 0) -> dict:
    """The sensor_msgs/Image fields for an (H, W, 3) uint8 RGB frame.

    Returns dict(encoding, width, height, step, data: bytes, is_bigendian), ready
    for ``decode_raw_image(**fields)``. ``row_padding`` zero bytes end each row
    (step = width * bpp + row_padding). Mono encodings store BT.601 luma; mono16
    stores 257 * luma so that it decodes back exactly.
    """
    arr = _check_rgb(rgb)
    enc = encoding.strip().lower()
    if enc not in SUPPORTED_ENCODINGS:
        raise ValueError(f"cannot encode {encoding!r}; encodable: {', '.join(SUPPORTED_ENCODINGS)}")
    if row_padding < 0:
        raise ValueError(f"row_padding must be >= 0, got {row_padding}")
    h, w = arr.shape[:2]
    if enc in _YUV:
        if w % 2:
            raise ValueError(f"{enc} needs an even width, got {w}")
        rows = _rgb_to_yuv422(arr, uyvy=enc in _UYVY)
    elif enc in ("mono8", "mono16"):
        grey = _luma(arr)
        rows = grey.astype(np.uint8) if enc == "mono8" else (grey * 257).astype(">u2" if is_bigendian else "<u2")
    else:  # rgb8, bgr8, rgba8, bgra8; alpha is opaque
        rows = arr[..., ::-1] if enc.startswith("bgr") else arr
        if enc.endswith("a8"):
            rows = np.concatenate([rows, np.full((h, w, 1), 255, np.uint8)], axis=2)  # (H, W, 4)
    rows = np.ascontiguousarray(rows).view(np.uint8).reshape(h, -1)  # (H, W*bpp)
    rows = np.pad(rows, ((0, 0), (0, row_padding)))  # (H, step)
    return dict(encoding=enc, width=w, height=h, step=rows.shape[1], data=rows.tobytes(),
                is_bigendian=bool(is_bigendian))


def encode_compressed_image(rgb: np.ndarray, fmt: str = "jpeg", quality: int = 90) -> tuple[str, bytes]:
    """(format string, bytes) of sensor_msgs/CompressedImage for an RGB frame.

    The format string is what image_transport's compressed publisher writes for a
    colour image: "rgb8; jpeg compressed bgr8" or "rgb8; png compressed bgr8".
    PNG is lossless; JPEG uses ``quality`` (1..100).
    """
    arr = _check_rgb(rgb)
    codec = {"jpeg": "jpeg", "jpg": "jpeg", "png": "png"}.get(fmt.strip().lower())
    if codec is None:
        raise ValueError(f"fmt must be 'jpeg' or 'png', got {fmt!r}")
    if not 1 <= quality <= 100:
        raise ValueError(f"quality must be in 1..100, got {quality}")
    out = io.BytesIO()
    params = {"quality": int(quality)} if codec == "jpeg" else {}
    Image.fromarray(arr).save(out, format=codec.upper(), **params)
    return f"rgb8; {codec} compressed bgr8", out.getvalue()
