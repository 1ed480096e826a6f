"""Exact tests of the ROS image field decoders (no ROS needed)."""

from __future__ import annotations

import array
import io
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image, ImageFile

from videokv_node.ingest import (
    SUPPORTED_ENCODINGS,
    ImageDecodeError,
    decode_compressed_image,
    decode_raw_image,
    encode_compressed_image,
    encode_raw_image,
)

RGB_LIKE = ("rgb8", "bgr8", "rgba8", "bgra8")
MONO = ("mono8", "mono16")
YUV = ("yuv422", "uyvy", "yuv422_yuy2", "yuyv")
# Rounding Y, U, V to 8 bit moves B by at most 0.5 * (1.164 + 2.018) plus 0.5 for the
# final rounding: < 2.1, so 2 levels (R and G are bounded lower).
YUV_TOLERANCE = 2


def _random_rgb(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _grey(h: int, w: int, seed: int = 0) -> np.ndarray:
    return np.repeat(_random_rgb(h, w, seed)[:, :, :1], 3, axis=2)


def _pair_constant(h: int, w: int, seed: int = 0) -> np.ndarray:
    """Pixel pairs share a colour, so 4:2:2 chroma subsampling loses nothing."""
    return np.repeat(_random_rgb(h, w // 2, seed), 2, axis=1)


def _opencv_yuv422_reference(y: int, u: int, v: int) -> tuple[int, int, int]:
    """One pixel of OpenCV's YUV2RGB (color_yuv.simd.hpp), written as scalar integers."""
    yy = max(0, y - 16) * 1220542
    u, v = u - 128, v - 128
    sat = lambda x: min(255, max(0, x >> 20))  # noqa: E731
    return (sat(yy + 1673527 * v + (1 << 19)), sat(yy - 852492 * v - 409993 * u + (1 << 19)),
            sat(yy + 2116026 * u + (1 << 19)))


def test_supported_encodings_are_the_documented_ones():
    assert set(SUPPORTED_ENCODINGS) == set(RGB_LIKE + MONO + YUV)


@pytest.mark.parametrize("encoding", RGB_LIKE)
def test_colour_round_trip_is_exact(encoding):
    rgb = _random_rgb(5, 7)
    fields = encode_raw_image(rgb, encoding)
    assert fields["step"] == 7 * (4 if encoding.endswith("a8") else 3)
    out = decode_raw_image(**fields)
    assert out.dtype == np.uint8 and out.shape == (5, 7, 3) and out.flags.c_contiguous
    np.testing.assert_array_equal(out, rgb)


def test_bgr8_bytes_are_in_blue_green_red_order():
    fields = encode_raw_image(np.array([[[10, 20, 30]]], np.uint8), "bgr8")
    assert fields["data"] == bytes([30, 20, 10])
    np.testing.assert_array_equal(decode_raw_image("bgr8", 1, 1, 3, bytes([30, 20, 10])), [[[10, 20, 30]]])
    np.testing.assert_array_equal(decode_raw_image("bgra8", 1, 1, 4, bytes([30, 20, 10, 0])), [[[10, 20, 30]]])


@pytest.mark.parametrize("encoding", MONO)
def test_mono_round_trip_of_grey_is_exact_and_replicated(encoding):
    grey = _grey(4, 6)
    np.testing.assert_array_equal(decode_raw_image(**encode_raw_image(grey, encoding)), grey)


def test_mono16_endianness():
    # 0x1234 stored little- then big-endian; the high byte 0x12 survives the 16 -> 8 bit scale.
    little = decode_raw_image("mono16", 1, 1, 2, bytes([0x34, 0x12]), is_bigendian=False)
    big = decode_raw_image("mono16", 1, 1, 2, bytes([0x12, 0x34]), is_bigendian=True)
    np.testing.assert_array_equal(little, [[[0x12] * 3]])
    np.testing.assert_array_equal(big, [[[0x12] * 3]])
    wrong = decode_raw_image("mono16", 1, 1, 2, bytes([0x12, 0x34]), is_bigendian=False)
    np.testing.assert_array_equal(wrong, [[[0x34] * 3]])
    assert encode_raw_image(_grey(1, 1), "mono16", is_bigendian=True)["is_bigendian"] is True


@pytest.mark.parametrize("encoding", RGB_LIKE + MONO + YUV)
def test_row_padding_is_ignored(encoding):
    rgb = _grey(3, 4) if encoding in MONO else _pair_constant(3, 4) if encoding in YUV else _random_rgb(3, 4)
    fields = encode_raw_image(rgb, encoding, row_padding=5)
    row_bytes = fields["step"] - 5
    data = bytearray(fields["data"])
    for r in range(3):  # garbage in the padding must not leak into the image
        data[r * fields["step"] + row_bytes: (r + 1) * fields["step"]] = b"\xab" * 5
    fields["data"] = bytes(data)
    assert decode_raw_image(**fields).tobytes() == decode_raw_image(**encode_raw_image(rgb, encoding)).tobytes()


def test_yuv422_matches_opencv_integer_arithmetic():
    rng = np.random.default_rng(3)
    packed = rng.integers(0, 256, (3, 8), dtype=np.uint8)  # 3 rows of 4 pixels
    for encoding, (iu, iy0, iv, iy1) in (("uyvy", (0, 1, 2, 3)), ("yuyv", (1, 0, 3, 2))):
        out = decode_raw_image(encoding, 4, 3, 8, packed.tobytes())
        for r in range(3):
            for q in range(2):
                quad = packed[r, 4 * q: 4 * q + 4].astype(int)
                for k, iy in enumerate((iy0, iy1)):
                    expect = _opencv_yuv422_reference(quad[iy], quad[iu], quad[iv])
                    assert tuple(out[r, 2 * q + k]) == expect
    # Limited range: Y = 16 is black, Y = 235 is white, neutral chroma.
    np.testing.assert_array_equal(decode_raw_image("uyvy", 2, 1, 4, bytes([128, 16, 128, 235])),
                                  [[[0, 0, 0], [255, 255, 255]]])


@pytest.mark.parametrize("encoding", YUV)
def test_yuv422_round_trip_of_pair_constant_image_within_quantisation(encoding):
    rgb = _pair_constant(16, 64)
    out = decode_raw_image(**encode_raw_image(rgb, encoding))
    assert np.abs(out.astype(int) - rgb).max() <= YUV_TOLERANCE


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "array"])
def test_result_never_aliases_the_input_buffer(kind):
    rgb = _random_rgb(2, 3)
    raw = encode_raw_image(rgb, "rgb8")["data"]
    data = {"bytes": lambda: raw, "bytearray": lambda: bytearray(raw),
            "memoryview": lambda: memoryview(bytearray(raw)), "array": lambda: array.array("B", raw)}[kind]()
    out = decode_raw_image("rgb8", 3, 2, 9, data)
    np.testing.assert_array_equal(out, rgb)
    assert not np.shares_memory(out, np.frombuffer(data, np.uint8))
    if kind != "bytes":  # rclpy may reuse the buffer: the frame must not change with it
        data[0] ^= 0xFF
        np.testing.assert_array_equal(out, rgb)


def test_extra_trailing_data_is_ignored():
    rgb = _random_rgb(2, 2)
    fields = encode_raw_image(rgb, "rgb8")
    fields["data"] += b"\x00" * 7
    np.testing.assert_array_equal(decode_raw_image(**fields), rgb)


@pytest.mark.parametrize(
    "args, reason, words",
    [
        (("32FC1", 2, 2, 8, bytes(16)), "unsupported_encoding", ["'32FC1'", "rgb8", "mono16"]),
        (("rgb8", 2, 2, 6, bytes(11)), "short_data", ["12", "11"]),
        (("rgb8", 0, 2, 6, bytes(12)), "zero_size", ["0x2"]),
        (("rgb8", 2, 0, 6, b""), "zero_size", ["2x0"]),
        (("rgb8", 4, 2, 10, bytes(40)), "bad_step", ["10", "12"]),
        (("mono16", 3, 1, 5, bytes(6)), "bad_step", ["5", "6"]),
        (("uyvy", 3, 1, 6, bytes(6)), "odd_width", ["3"]),
    ],
)
def test_raw_errors_have_a_reason_and_say_why(args, reason, words):
    with pytest.raises(ImageDecodeError) as info:
        decode_raw_image(*args)
    assert info.value.reason == reason
    assert isinstance(info.value, ValueError)
    for word in words:
        assert word in str(info.value)


def test_short_data_message_states_expected_and_got():
    with pytest.raises(ImageDecodeError, match=r"expected .* = 12 bytes, got 11"):
        decode_raw_image("rgb8", 2, 2, 6, bytes(11))


def test_error_keeps_its_reason_when_pickled():
    err = pickle.loads(pickle.dumps(ImageDecodeError("short_data", "expected 12 bytes, got 11")))
    assert (err.reason, str(err)) == ("short_data", "expected 12 bytes, got 11")


def test_non_buffer_data_is_a_type_error():
    with pytest.raises(TypeError, match="bytes-like"):
        decode_raw_image("mono8", 1, 1, 1, [0])


@given(
    h=st.integers(1, 9),
    half_w=st.integers(1, 6),
    encoding=st.sampled_from(SUPPORTED_ENCODINGS),
    padding=st.integers(0, 7),
    big=st.booleans(),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=200, deadline=None)
def test_property_decode_of_encode_is_identity(h, half_w, encoding, padding, big, seed):
    w = 2 * half_w + (encoding not in YUV and seed % 2)  # odd widths too, where the encoding allows
    if encoding in MONO:
        rgb = _grey(h, w, seed)
    elif encoding in YUV:
        rgb = _pair_constant(h, w, seed)
    else:
        rgb = _random_rgb(h, w, seed)
    fields = encode_raw_image(rgb, encoding, is_bigendian=big, row_padding=padding)
    out = decode_raw_image(**fields)
    assert out.shape == (h, w, 3) and out.flags.c_contiguous
    if encoding in YUV:  # 4:2:2 is lossy by rounding only, for pair-constant input
        assert np.abs(out.astype(int) - rgb).max() <= YUV_TOLERANCE
    else:
        np.testing.assert_array_equal(out, rgb)


def _smooth_rgb(h: int = 48, w: int = 64) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([x * 255 // (w - 1), y * 255 // (h - 1), np.full_like(x, 90)], -1).astype(np.uint8)


def test_png_round_trip_is_exact_and_format_string_is_image_transport_style():
    rgb = _random_rgb(9, 11)
    fmt, data = encode_compressed_image(rgb, "png")
    assert fmt == "rgb8; png compressed bgr8"
    np.testing.assert_array_equal(decode_compressed_image(fmt, data), rgb)
    np.testing.assert_array_equal(decode_compressed_image("png", bytearray(data)), rgb)


def test_jpeg_round_trip_is_close():
    rgb = _smooth_rgb()
    fmt, data = encode_compressed_image(rgb, "jpeg", quality=95)
    assert fmt == "rgb8; jpeg compressed bgr8" and data[:2] == b"\xff\xd8"
    out = decode_compressed_image(fmt, data)
    assert out.shape == rgb.shape and out.dtype == np.uint8
    assert np.abs(out.astype(int) - rgb).mean() < 2.0
    # Colour order: the red-gradient corner stays red.
    assert out[0, -1, 0] > 200 and out[0, -1, 2] < 120


@pytest.mark.parametrize("fmt", ["jpeg", "png", "", "bgr8; jpeg compressed bgr8", "rgb8; png compressed bgr8"])
def test_format_string_variants_are_accepted_and_bytes_decide(fmt):
    rgb = _random_rgb(4, 4)
    _, png = encode_compressed_image(rgb, "png")
    np.testing.assert_array_equal(decode_compressed_image(fmt, png), rgb)


@pytest.mark.parametrize("mode", ["L", "RGBA", "P", "LA"])
def test_grey_alpha_and_palette_images_become_rgb(mode):
    src = Image.fromarray(_grey(5, 6)).convert(mode)
    buf = io.BytesIO()
    src.save(buf, format="PNG")
    out = decode_compressed_image("png", buf.getvalue())
    np.testing.assert_array_equal(out, np.array(src.convert("RGB")))


def test_sixteen_bit_grey_png_is_scaled_like_mono16():
    grey16 = np.array([[0, 257, 0x1234, 65535]], dtype=np.uint16)
    buf = io.BytesIO()
    Image.fromarray(grey16).save(buf, format="PNG")
    out = decode_compressed_image("png", buf.getvalue())
    np.testing.assert_array_equal(out[..., 0], [[0, 1, 0x12, 255]])


def test_compressed_errors():
    _, jpeg = encode_compressed_image(_random_rgb(32, 32), "jpeg")
    _, png = encode_compressed_image(_random_rgb(32, 32), "png")
    cases = [
        (("jpeg", b""), "zero_size"),
        (("jpeg", b"\xff\xd8\xff" + bytes(64)), "corrupt_compressed"),  # JPEG magic, garbage header
        (("jpeg", b"definitely not an image"), "corrupt_compressed"),
        (("jpeg", jpeg[: len(jpeg) // 2]), "corrupt_compressed"),  # truncated in the scan data
        (("png", png[: len(png) // 2]), "corrupt_compressed"),  # truncated inside IDAT
        (("rgb8; compressedDepth png", png), "unsupported_format"),
        (("tiff", png), "unsupported_format"),
        (("png", png, 32 * 32 - 1), "too_large"),
    ]
    for args, reason in cases:
        with pytest.raises(ImageDecodeError) as info:
            decode_compressed_image(*args)
        assert info.value.reason == reason, (args[0], len(args[1]))
    np.testing.assert_array_equal(decode_compressed_image("png", png, 32 * 32).shape, (32, 32, 3))
    assert ImageFile.LOAD_TRUNCATED_IMAGES is False


def test_truncation_tolerance_switched_on_elsewhere_is_refused(monkeypatch):
    _, png = encode_compressed_image(_random_rgb(4, 4), "png")
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(RuntimeError, match="LOAD_TRUNCATED_IMAGES"):
        decode_compressed_image("png", png)


def test_encoder_input_validation():
    with pytest.raises(ValueError):
        encode_raw_image(np.zeros((2, 2), np.uint8))
    with pytest.raises(ValueError):
        encode_raw_image(np.zeros((2, 2, 3), np.float32))
    with pytest.raises(ValueError, match="32FC1"):
        encode_raw_image(_random_rgb(2, 2), "32FC1")
    with pytest.raises(ValueError, match="even width"):
        encode_raw_image(_random_rgb(2, 3), "uyvy")
    with pytest.raises(ValueError):
        encode_compressed_image(_random_rgb(2, 2), "webp")
    with pytest.raises(ValueError):
        encode_compressed_image(_random_rgb(2, 2), "jpeg", quality=0)
