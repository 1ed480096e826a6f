"""Exact tests of frame intake: the cheap message check, decode only after sampling, per-camera counts.

No ROS: the decoders' fields are passed as the node passes them from a message.
"""

from __future__ import annotations

import array

import numpy as np
import pytest

from videokv_node.ingest import NS_PER_S, FrameSampler, SampleDecision, SamplerConfig, encode_compressed_image, encode_raw_image
from videokv_node.ingest.frame_intake import FrameIntake, Outcome
from videokv_node.ingest.image_decode import (
    ImageDecodeError,
    check_compressed_image,
    check_raw_image,
    decode_compressed_image,
    decode_raw_image,
)

RGB = np.random.default_rng(0).integers(0, 256, (6, 8, 3), dtype=np.uint8)


# --- the cheap check -------------------------------------------------------------
@pytest.mark.parametrize(("fields", "reason"), [
    (dict(encoding="rgb8", width=0, height=6, step=0, data_len=0), "zero_size"),
    (dict(encoding="32FC1", width=8, height=6, step=32, data_len=192), "unsupported_encoding"),
    (dict(encoding="yuyv", width=7, height=6, step=14, data_len=84), "odd_width"),
    (dict(encoding="rgb8", width=8, height=6, step=23, data_len=192), "bad_step"),
    (dict(encoding="rgb8", width=8, height=6, step=24, data_len=143), "short_data"),
])
def test_raw_check_refuses_what_decode_refuses_with_the_same_reason(fields, reason):
    with pytest.raises(ImageDecodeError) as checked:
        check_raw_image(**fields)
    data = b"\0" * fields.pop("data_len")
    with pytest.raises(ImageDecodeError) as decoded:
        decode_raw_image(data=data, **fields)
    assert checked.value.reason == decoded.value.reason == reason


def test_raw_check_passes_a_padded_frame_and_normalises_the_encoding():
    f = encode_raw_image(RGB, "bgr8", row_padding=4)
    assert check_raw_image(" BGR8 ", f["width"], f["height"], f["step"], len(f["data"])) == "bgr8"


def test_compressed_check_reads_format_emptiness_and_signature_only():
    fmt, jpeg = encode_compressed_image(RGB, "jpeg")
    check_compressed_image(fmt, jpeg)
    check_compressed_image("png", encode_compressed_image(RGB, "png")[1])
    check_compressed_image(fmt, array.array("B", jpeg[:8]))  # a truncated body passes: only decode finds it
    with pytest.raises(ImageDecodeError) as truncated:
        decode_compressed_image(fmt, jpeg[: len(jpeg) // 2])
    assert truncated.value.reason == "corrupt_compressed"
    for fmt_, data, reason in (("jpeg", b"", "zero_size"), ("jpeg", b"GIF89a...", "corrupt_compressed"),
                               ("16UC1; compressedDepth png", jpeg, "unsupported_format"),
                               ("bmp", jpeg, "unsupported_format")):
        with pytest.raises(ImageDecodeError) as exc:
            check_compressed_image(fmt_, data)
        assert exc.value.reason == reason, (fmt_, data[:8])


# --- sampler: a sampled frame that cannot be decoded gives its slot back -------------
def test_give_back_lets_the_next_newer_frame_take_the_slot():
    sampler = FrameSampler(SamplerConfig(sample_fps=0.5))
    s = NS_PER_S
    assert sampler.offer("cam", 0).admitted
    assert sampler.offer("cam", 2 * s) is SampleDecision.ACCEPT
    assert sampler.give_back("cam", 2 * s)
    assert not sampler.give_back("cam", 2 * s)  # once
    assert sampler.offer("cam", 2 * s) is SampleDecision.SKIP  # the same stamp again is not newer
    assert sampler.offer("cam", 2 * s + 1) is SampleDecision.ACCEPT  # not 4 s: the slot was free
    assert sampler.offer("cam", 3 * s) is SampleDecision.SKIP  # spaced from the frame that took it
    assert sampler.offer("cam", 4 * s + 1) is SampleDecision.ACCEPT
    assert not sampler.give_back("cam", 2 * s + 1)  # only the last admitted frame
    assert not sampler.give_back("other", 0)
    c = sampler.counters()["cam"]
    assert (c.offered, c.accepted, c.skipped, c.given_back) == (6, 4, 2, 1)


def test_give_back_after_a_clock_reset_reopens_the_slot():
    sampler = FrameSampler(SamplerConfig(sample_fps=0.5, reset_backward_s=2.0))
    assert sampler.offer("cam", 100 * NS_PER_S).admitted
    assert sampler.offer("cam", 10 * NS_PER_S) is SampleDecision.RESET
    assert sampler.give_back("cam", 10 * NS_PER_S)
    assert sampler.offer("cam", 10 * NS_PER_S + 1) is SampleDecision.ACCEPT


# --- intake: check -> sample -> decode, counted exactly ------------------------------
class _Calls:
    """Check and decode callables that count their calls; ``bad`` frames fail the named step."""

    def __init__(self) -> None:
        self.checks = self.decodes = 0

    def check(self, bad: bool):
        def run():
            self.checks += 1
            if bad:
                raise ImageDecodeError("short_data", "short")
        return run

    def decode(self, bad: bool):
        def run():
            self.decodes += 1
            if bad:
                raise ImageDecodeError("corrupt_compressed", "corrupt body")
            return RGB.copy()
        return run


def test_only_sampled_frames_are_decoded_at_15_hz_sampled_at_half_a_frame_per_second():
    intake, calls = FrameIntake(FrameSampler(SamplerConfig(sample_fps=0.5))), _Calls()
    outcomes = [intake.offer("cam", round(i * NS_PER_S / 15), calls.check(False), calls.decode(False)).outcome
                for i in range(150)]  # 10 s
    assert calls.checks == 150 and calls.decodes == 5  # frames at 0, 2, 4, 6, 8 s
    assert [i for i, o in enumerate(outcomes) if o is Outcome.SAMPLED] == [0, 30, 60, 90, 120]
    assert intake.counts() == {"cam": {"received": 150, "sampled": 5, "skipped": 145}}


def test_a_malformed_frame_is_counted_and_takes_no_slot_nor_decode():
    intake, calls = FrameIntake(FrameSampler(SamplerConfig(sample_fps=0.5))), _Calls()
    r = intake.offer("cam", 0, calls.check(True), calls.decode(False))
    assert (r.outcome, r.decision, r.reason, r.rgb) == (Outcome.MALFORMED, None, "short_data", None)
    r = intake.offer("cam", 1, calls.check(False), calls.decode(False))  # the first good frame is still first
    assert r.outcome is Outcome.SAMPLED and r.rgb.shape == (6, 8, 3)
    assert calls.decodes == 1
    assert intake.counts()["cam"] == {"received": 2, "malformed": 1, "malformed_short_data": 1, "sampled": 1}


def test_a_sampled_frame_that_fails_to_decode_is_counted_and_the_next_frame_takes_its_slot():
    intake, calls = FrameIntake(FrameSampler(SamplerConfig(sample_fps=0.5))), _Calls()
    s = NS_PER_S
    assert intake.offer("cam", 0, calls.check(False), calls.decode(False)).outcome is Outcome.SAMPLED
    r = intake.offer("cam", 2 * s, calls.check(False), calls.decode(True))
    assert (r.outcome, r.decision, r.reason) == (Outcome.UNDECODABLE, SampleDecision.ACCEPT, "corrupt_compressed")
    assert intake.offer("cam", 2 * s + s // 15, calls.check(False), calls.decode(False)).outcome is Outcome.SAMPLED
    assert intake.offer("cam", 3 * s, calls.check(False), calls.decode(False)).outcome is Outcome.SKIPPED
    assert intake.offer("cam", s, calls.check(False), calls.decode(False)).outcome is Outcome.STALE
    assert calls.decodes == 3
    assert intake.counts()["cam"] == {"received": 5, "sampled": 2, "undecodable": 1,
                                      "undecodable_corrupt_compressed": 1, "skipped": 1, "stale": 1}


def test_cameras_are_counted_apart_and_later_stages_add_their_counts():
    intake, calls = FrameIntake(FrameSampler(SamplerConfig(sample_fps=0.5))), _Calls()
    for camera in ("a", "b", "a"):
        intake.offer(camera, 0, calls.check(False), calls.decode(False))
    intake.count("b", "dropped_deactivated")
    assert intake.counts() == {"a": {"received": 2, "sampled": 1, "skipped": 1},
                               "b": {"received": 1, "sampled": 1, "dropped_deactivated": 1}}
