"""Exact tests of the stamp-based frame sampler."""

from __future__ import annotations

import math
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from videokv_node.ingest import (
    NS_PER_S,
    CameraCounters,
    FrameSampler,
    SampleDecision,
    SamplerConfig,
    stamp_to_ns,
)

A, S, T, R = SampleDecision.ACCEPT, SampleDecision.SKIP, SampleDecision.STALE, SampleDecision.RESET
MS = 1_000_000


def _stream_30fps(seconds: float, jitter_ns=lambda i: 0) -> list[int]:
    return [round(i * NS_PER_S / 30) + jitter_ns(i) for i in range(round(seconds * 30))]


def _accepted(sampler: FrameSampler, stamps: list[int], camera: str = "cam") -> list[int]:
    return [s for s in stamps if sampler.offer(camera, s).admitted]


def test_defaults_are_half_a_frame_per_second_with_one_ms_tolerance():
    cfg = SamplerConfig()
    assert (cfg.sample_fps, cfg.period_ns, cfg.tolerance_ns, cfg.reset_backward_ns) == (0.5, 2 * NS_PER_S, MS, 2 * NS_PER_S)


def test_30fps_at_half_fps_over_10s_keeps_0_2_4_6_8_seconds():
    assert _accepted(FrameSampler(), _stream_30fps(10)) == [0, 2 * NS_PER_S, 4 * NS_PER_S, 6 * NS_PER_S, 8 * NS_PER_S]


def test_jitter_within_tolerance_does_not_drift():
    # +-0.5 ms of jitter, alternating: the on-time frames (every 60th) are still the ones kept.
    stamps = _stream_30fps(10, jitter_ns=lambda i: (MS // 2) * (1 if i % 2 else -1))
    assert _accepted(FrameSampler(), stamps) == [stamps[i] for i in (0, 60, 120, 180, 240)]


def test_without_tolerance_one_late_first_frame_shifts_the_phase():
    # First frame 0.3 ms late: with no tolerance the 2 s frame is 0.3 ms too early, the
    # 2.033 s one is taken and every later pick is a frame late; 1 ms tolerance prevents it.
    stamps = _stream_30fps(5)
    stamps[0] = 300_000
    assert _accepted(FrameSampler(SamplerConfig(tolerance_s=0.0)), stamps) == [300_000, stamps[61], stamps[121]]
    assert _accepted(FrameSampler(), stamps) == [300_000, stamps[60], stamps[120]]


def test_decisions_for_concrete_stamps():
    s = FrameSampler()
    seq = [(5 * NS_PER_S, A), (6 * NS_PER_S, S), (7 * NS_PER_S - MS, A), (7 * NS_PER_S, S),
           (6 * NS_PER_S, T), (5 * NS_PER_S, T),  # 1 s and 2 s back: out of order, dropped
           (9 * NS_PER_S - 3 * MS, S), (9 * NS_PER_S - 2 * MS, A)]  # 2 s - 1 ms after 7 s - 1 ms
    assert [s.offer("cam", t) for t, _ in seq] == [d for _, d in seq]


def test_backward_jump_beyond_threshold_is_a_reset_and_rebases():
    s = FrameSampler()
    assert s.offer("cam", 100 * NS_PER_S) is A
    assert s.offer("cam", 101 * NS_PER_S) is S
    assert s.offer("cam", 99 * NS_PER_S) is T  # exactly 2 s behind the newest seen: still stale
    assert s.offer("cam", 99 * NS_PER_S - 1) is R  # 2 s + 1 ns: clock reset (bag loop)
    assert s.offer("cam", 100 * NS_PER_S) is S  # spacing now counts from the reset frame
    assert s.offer("cam", 101 * NS_PER_S - 1) is A
    assert s.counters()["cam"] == CameraCounters(offered=6, accepted=3, skipped=2, stale=1, resets=1)
    assert R.admitted and A.admitted and not S.admitted and not T.admitted


def test_staleness_is_measured_from_the_newest_stamp_seen_not_the_last_accepted():
    s = FrameSampler()
    s.offer("cam", 0)
    s.offer("cam", 1900 * MS)  # skipped, but now the newest stamp
    assert s.offer("cam", 1000 * MS) is T  # newer than the last accepted (0) yet out of order
    assert s.offer("cam", 1900 * MS - 2 * NS_PER_S - 1) is R  # > 2 s behind the newest


def test_cameras_are_independent():
    s = FrameSampler()
    offers = [("left", 0), ("right", 1), ("left", 1), ("right", 2), ("left", 2), ("right", 3)]  # seconds
    assert [s.offer(cam, t * NS_PER_S) for cam, t in offers] == [A, A, S, S, A, A]
    counters = s.counters()
    assert counters["left"] == CameraCounters(offered=3, accepted=2, skipped=1)
    assert counters["right"] == CameraCounters(offered=3, accepted=2, skipped=1)


def test_zero_fps_keeps_every_newer_frame_and_drops_repeats_and_stale():
    s = FrameSampler(SamplerConfig(sample_fps=0.0))
    assert [s.offer("cam", t) for t in (10, 11, 11, 12, 5, 13, 10 * NS_PER_S, 1)] == [A, A, S, A, T, A, A, R]


def test_reset_forgets_state_and_counters():
    s = FrameSampler()
    for camera, stamp in (("a", 0), ("a", 1), ("b", 0)):
        s.offer(camera, stamp)
    s.reset("a")
    assert set(s.counters()) == {"b"}
    assert s.offer("a", 1) is A  # a first frame again
    s.reset()
    assert s.counters() == {}
    assert s.offer("b", 1) is A


def test_counters_are_a_snapshot():
    s = FrameSampler()
    s.offer("cam", 0)
    snap = s.counters()
    snap["cam"].offered = 99
    assert s.counters()["cam"].offered == 1


def test_float_stamps_are_refused_and_numpy_ints_accepted():
    import numpy as np

    s = FrameSampler()
    with pytest.raises(TypeError):
        s.offer("cam", 1.5e9)
    assert s.offer("cam", np.int64(5)) is A


def test_stamp_to_ns_is_exact():
    assert stamp_to_ns(1_700_000_000, 123_456_789) == 1_700_000_000_123_456_789
    with pytest.raises(ValueError):
        stamp_to_ns(1, NS_PER_S)


@pytest.mark.parametrize(
    "kwargs",
    [dict(sample_fps=math.nan), dict(sample_fps=math.inf), dict(tolerance_s=-0.001), dict(tolerance_s=math.nan),
     dict(reset_backward_s=0.0), dict(reset_backward_s=-1.0), dict(reset_backward_s=math.inf),
     dict(sample_fps=10.0, tolerance_s=0.1), dict(sample_fps=1e10)],
)
def test_invalid_config_raises(kwargs):
    with pytest.raises(ValueError):
        SamplerConfig(**kwargs)


def test_parallel_offers_count_every_frame_once():
    s = FrameSampler(SamplerConfig(sample_fps=0.0))

    def feed(camera: str) -> None:
        for t in range(2000):
            s.offer(camera, t)

    threads = [threading.Thread(target=feed, args=(f"cam{k % 2}",)) for k in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for c in s.counters().values():  # two threads per camera, 4000 offers each
        assert c.offered == 4000 and c.accepted + c.skipped + c.stale == 4000 and c.resets == 0


@given(
    fps=st.sampled_from([0.0, 0.5, 1.0, 2.0, 7.5, 30.0]),
    tol_ms=st.integers(0, 20),
    steps=st.lists(st.integers(-1_900 * MS, 1_000 * MS), min_size=1, max_size=200),
)
@settings(max_examples=300, deadline=None)
def test_property_accepted_stamps_increase_and_are_spaced(fps, tol_ms, steps):
    cfg = SamplerConfig(sample_fps=fps, tolerance_s=tol_ms / 1000)
    s = FrameSampler(cfg)
    newest, accepted = 10 * NS_PER_S, []
    for step in steps:  # at most 1.9 s behind the newest stamp seen: stale, never a reset
        stamp = newest + step
        newest = max(newest, stamp)
        decision = s.offer("cam", stamp)
        assert decision is not R
        if decision.admitted:
            accepted.append(stamp)
    gaps = [b - a for a, b in zip(accepted, accepted[1:])]
    assert all(g > 0 for g in gaps)
    assert all(g >= cfg.period_ns - cfg.tolerance_ns for g in gaps)
    c = s.counters()["cam"]
    assert c.offered == len(steps) == c.accepted + c.skipped + c.stale and c.accepted == len(accepted)
