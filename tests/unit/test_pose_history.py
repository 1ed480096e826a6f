"""Poses: slerp and interpolation against hand-computed values, and the bounded pose history."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from videokv_node.ingest.pose_history import PoseAdd, PoseConfig, PoseHistory
from videokv_node.pose import Pose, interpolate, quaternion_angle, slerp, yaw_quaternion

S = 1_000_000_000
ID = (0.0, 0.0, 0.0, 1.0)


def close(a, b, tol=1e-9):
    return all(abs(x - y) <= tol for x, y in zip(a, b, strict=True))


# --- slerp by hand ------------------------------------------------------------------
def test_slerp_halfway_between_identity_and_90_degrees_about_z_is_45_degrees():
    # 90 deg about z: (0, 0, sin 45, cos 45). Halfway: 45 deg, (0, 0, sin 22.5, cos 22.5).
    q90 = (0.0, 0.0, math.sqrt(0.5), math.sqrt(0.5))
    assert close(slerp(ID, q90, 0.5), (0.0, 0.0, math.sin(math.pi / 8), math.cos(math.pi / 8)))
    # A quarter of the way: 22.5 deg.
    assert close(slerp(ID, q90, 0.25), (0.0, 0.0, math.sin(math.pi / 16), math.cos(math.pi / 16)))


def test_slerp_takes_the_short_arc_when_quaternions_have_opposite_signs():
    # 170 deg and -170 deg about z are 20 deg apart through 180; halfway is 180 deg, not 0.
    a = (0.0, 0.0, math.sin(math.radians(85)), math.cos(math.radians(85)))
    b = (0.0, 0.0, math.sin(math.radians(-85)), math.cos(math.radians(-85)))
    mid = slerp(a, b, 0.5)
    assert abs(abs(mid[2]) - 1.0) < 1e-9 and abs(mid[3]) < 1e-9  # (0, 0, +-1, 0): 180 deg about z


def test_slerp_of_nearly_equal_quaternions_is_normalised():
    a = (0.0, 0.0, 0.0, 1.0)
    b = (0.0, 0.0, 1e-5, 1.0)
    q = slerp(a, b, 0.5)
    assert abs(sum(v * v for v in q) - 1.0) < 1e-12
    assert abs(q[2] - 0.5e-5) < 1e-9


def test_interpolate_position_linearly_and_keeps_the_frame():
    a = Pose.make("odom", (0.0, 0.0, 0.0), ID)
    b = Pose.make("odom", (2.0, -4.0, 1.0), yaw_quaternion(math.pi / 2))
    p = interpolate(a, b, 0.25)
    assert p.frame_id == "odom"
    assert close(p.position, (0.5, -1.0, 0.25))
    assert abs(quaternion_angle(p.orientation, yaw_quaternion(math.pi / 8))) < 1e-9
    with pytest.raises(ValueError):
        interpolate(a, Pose.make("map", (0, 0, 0), ID), 0.5)


def test_pose_make_refuses_non_finite_and_zero_quaternions_and_normalises():
    with pytest.raises(ValueError):
        Pose.make("odom", (math.nan, 0, 0), ID)
    with pytest.raises(ValueError):
        Pose.make("odom", (0, 0, 0), (0, 0, math.inf, 1))
    with pytest.raises(ValueError):
        Pose.make("odom", (0, 0, 0), (0, 0, 0, 0))
    assert close(Pose.make("odom", (0, 0, 0), (0, 0, 0, 2)).orientation, ID)


# --- the history --------------------------------------------------------------------
def history(**kw) -> PoseHistory:
    return PoseHistory(PoseConfig(pose_topic="odom", **kw))


def test_history_interpolates_at_a_frame_stamp_between_two_poses():
    h = history()
    assert h.add(10 * S, "odom", (0, 0, 0), ID) is PoseAdd.ADDED
    assert h.add(12 * S, "odom", (4, 2, 0), yaw_quaternion(math.pi / 2)) is PoseAdd.ADDED
    p = h.at(10 * S + S // 2)  # a quarter of the way
    assert close(p.position, (1.0, 0.5, 0.0))
    assert abs(quaternion_angle(p.orientation, yaw_quaternion(math.pi / 8))) < 1e-9
    assert h.at(12 * S).position == (4.0, 2.0, 0.0)  # exact stamp: that pose
    assert h.counters.frames_with_pose == 2


def test_history_outside_the_span_within_tolerance_gives_the_end_pose_else_none_counted():
    h = history(pose_tolerance_s=0.1)
    h.add(10 * S, "odom", (1, 0, 0), ID)
    h.add(11 * S, "odom", (2, 0, 0), ID)
    assert h.at(11 * S + 100_000_000).position == (2.0, 0.0, 0.0)  # 0.1 s after: the newest pose
    assert h.at(10 * S - 100_000_000).position == (1.0, 0.0, 0.0)
    assert h.at(11 * S + 100_000_001) is None
    assert h.at(10 * S - 100_000_001) is None
    assert (h.counters.frames_with_pose, h.counters.frames_without_pose) == (2, 2)
    assert history().at(5 * S) is None  # empty history


def test_history_drops_non_finite_and_backwards_poses_counted():
    h = history()
    h.add(10 * S, "odom", (0, 0, 0), ID)
    assert h.add(11 * S, "odom", (math.nan, 0, 0), ID) is PoseAdd.NON_FINITE
    assert h.add(11 * S, "odom", (0, 0, 0), (math.inf, 0, 0, 1)) is PoseAdd.NON_FINITE
    assert h.add(9 * S, "odom", (5, 0, 0), ID) is PoseAdd.BACKWARDS  # 1 s back: out of order
    assert h.add(10 * S, "odom", (5, 0, 0), ID) is PoseAdd.BACKWARDS  # repeated stamp
    c = h.counters
    assert (c.received, c.added, c.non_finite, c.backwards) == (5, 1, 2, 2)
    assert len(h) == 1 and h.at(10 * S).position == (0.0, 0.0, 0.0)


def test_history_restarts_on_a_clock_reset_or_another_frame():
    h = history(pose_reset_backward_s=2.0)
    h.add(100 * S, "odom", (0, 0, 0), ID)
    h.add(101 * S, "odom", (1, 0, 0), ID)
    assert h.add(5 * S, "odom", (9, 0, 0), ID) is PoseAdd.RESET  # 96 s back: a bag loop
    assert len(h) == 1 and h.span_ns() == (5 * S, 5 * S)
    assert h.add(6 * S, "map", (3, 0, 0), ID) is PoseAdd.RESET
    assert h.at(6 * S).frame_id == "map" and h.counters.resets == 2


def test_history_is_bounded_and_keeps_the_newest():
    h = history(pose_history_size=3)
    for i in range(10):
        h.add(i * S, "odom", (i, 0, 0), ID)
    assert len(h) == 3 and h.span_ns() == (7 * S, 9 * S)
    assert h.at(2 * S) is None


def test_config_refuses_bad_values():
    for kw in (dict(pose_type="twist"), dict(pose_source="gps"), dict(pose_tolerance_s=-1.0),
               dict(pose_tolerance_s=math.nan), dict(pose_history_size=1), dict(pose_source="tf", base_frame="")):
        with pytest.raises(ValueError):
            PoseConfig(**kw)
    assert not PoseConfig().enabled and PoseConfig(pose_topic="odom").enabled


# --- properties ---------------------------------------------------------------------
angles = st.floats(-math.pi, math.pi, allow_nan=False)
fractions = st.floats(0.0, 1.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(angles, angles, fractions)
def test_slerp_of_yaws_is_the_yaw_of_the_short_arc_fraction(a, b, t):
    """About one axis, slerp is linear in angle along the shorter way round."""
    d = (b - a + math.pi) % (2 * math.pi) - math.pi  # signed short difference in [-pi, pi)
    # Half a turn apart, both ways round are equally short (the quaternions' dot is 0): no single answer.
    assume(abs(abs(d) - math.pi) > 1e-6)
    q = slerp(yaw_quaternion(a), yaw_quaternion(b), t)
    assert abs(sum(v * v for v in q) - 1.0) < 1e-9
    assert quaternion_angle(q, yaw_quaternion(a + t * d)) < 1e-6


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 10**6), min_size=2, max_size=30, unique=True), st.integers(0, 10**6))
def test_history_position_is_between_its_neighbours(stamps, probe):
    """Positions x = stamp: interpolated x equals the stamp inside the span (linear in time)."""
    h = history(pose_tolerance_s=0.0)
    for s in sorted(stamps):
        h.add(s, "odom", (float(s), 0.0, 0.0), ID)
    p = h.peek(probe)
    lo, hi = min(stamps), max(stamps)
    if lo <= probe <= hi:
        assert abs(p.position[0] - probe) < 1e-6
    else:
        assert p is None
