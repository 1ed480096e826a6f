"""Frames parked for their odometry (``pose_source: topic``, ``pose_wait_s``): PoseWait driven by the
pose history's ``resolve`` and ``settle`` (ingest/pose_history.py), exact steps on a hand-driven clock.

The odometry published is x = stamp in ms, so an interpolated pose's x is the frame's stamp in ms."""

from __future__ import annotations

import pytest
from videokv_node.ingest.pose_history import PoseConfig, PoseHistory
from videokv_node.ingest.pose_wait import PoseWait

MS = 1_000_000
ID = (0.0, 0.0, 0.0, 1.0)


def odom(history: PoseHistory, *stamps_ms: int) -> None:
    for s in stamps_ms:
        history.add(s * MS, "odom", (float(s), 0.0, 0.0), ID)


def parked(wait_ms: int = 500, tolerance_s: float = 0.1) -> tuple[PoseHistory, PoseWait]:
    config = PoseConfig(pose_topic="odom", pose_tolerance_s=tolerance_s, pose_wait_s=wait_ms / 1000)
    return PoseHistory(config), PoseWait(config.topic_wait_ns, capacity=8)


def step(h: PoseHistory, w: PoseWait, now_ms: int):
    return [(r.item, r.reason, r.pose.position[0] if r.pose else None, r.waited_ns // MS, r.waited)
            for r in w.release(h.resolve, h.settle, now_ns=now_ms * MS)]


def test_a_frame_newer_than_the_newest_odometry_waits_and_gets_the_interpolated_pose_when_it_arrives():
    h, w = parked()
    odom(h, 100)
    w.park("cam", 125 * MS, "f1", now_ns=0)
    assert step(h, w, 0) == [] and len(w) == 1  # 25 ms past the newest pose: within tolerance, but it waits
    assert step(h, w, 30) == []
    odom(h, 150)  # the odometry covering the frame, 40 ms late on the node clock
    assert step(h, w, 40) == [("f1", "resolved", 125.0, 40, True)]
    assert h.counters.frames_with_pose == 0  # PoseWait counts nothing: the caller (ros/pose_parking.py) does


def test_a_frame_whose_odometry_is_already_there_leaves_at_once_with_the_exact_or_interpolated_pose():
    h, w = parked()
    odom(h, 100, 200)
    w.park("cam", 200 * MS, "exact", now_ns=0)
    w.park("cam", 175 * MS, "between", now_ns=0)
    assert step(h, w, 0) == [("exact", "resolved", 200.0, 0, False), ("between", "resolved", 175.0, 0, False)]


def test_a_frame_whose_odometry_never_comes_gets_todays_rule_at_its_deadline():
    h, w = parked(wait_ms=500, tolerance_s=0.1)
    odom(h, 100)
    w.park("cam", 180 * MS, "near", now_ns=0)  # 80 ms past the newest pose: its pose, as nearest
    w.park("cam", 300 * MS, "far", now_ns=10 * MS)  # 200 ms past: none
    assert step(h, w, 499) == []
    assert step(h, w, 500) == [("near", "nearest", 100.0, 500, True)]  # far's wait is not over yet
    assert step(h, w, 510) == [("far", "outside_span", None, 500, True)]
    assert len(w) == 0


def test_without_any_odometry_a_frame_settles_as_no_pose_yet():
    h, w = parked(wait_ms=200)
    w.park("cam", 5 * MS, "f1", now_ns=0)
    assert step(h, w, 199) == []
    assert step(h, w, 200) == [("f1", "no_pose_yet", None, 200, True)]


def test_a_frame_before_the_oldest_pose_resolves_within_tolerance_and_otherwise_waits_its_wait():
    h, w = parked(wait_ms=500, tolerance_s=0.1)
    odom(h, 1000, 1100)
    w.park("a", 950 * MS, "near", now_ns=0)  # 50 ms before the oldest: that pose, at once
    w.park("b", 500 * MS, "old", now_ns=0)  # 500 ms before: no later pose will help; it waits, then none
    assert step(h, w, 0) == [("near", "resolved", 1000.0, 0, False)]
    assert step(h, w, 500) == [("old", "outside_span", None, 500, True)]


def test_one_cameras_frames_leave_in_stamp_order_and_other_cameras_do_not_wait():
    h, w = parked()
    odom(h, 100)
    w.park("a", 130 * MS, "a1", now_ns=0)  # waits for odometry past 130 ms
    w.park("a", 100 * MS, "a2", now_ns=0)  # resolvable, but behind a1
    w.park("b", 90 * MS, "b1", now_ns=0)  # another camera: goes on
    assert step(h, w, 0) == [("b1", "resolved", 100.0, 0, False)]
    odom(h, 140)
    assert step(h, w, 20) == [("a1", "resolved", 130.0, 20, True), ("a2", "resolved", 100.0, 20, True)]


def test_resolve_and_settle_read_the_history_without_counting():
    h, _ = parked()
    assert h.resolve(5 * MS) is None and h.settle(5 * MS) == (None, "no_pose_yet")
    odom(h, 100, 200)
    assert h.resolve(150 * MS).position[0] == 150.0 and h.resolve(201 * MS) is None
    pose, reason = h.settle(250 * MS)
    assert (pose.position[0], reason) == (200.0, "nearest")
    assert h.settle(150 * MS)[1] == "resolved" and h.settle(400 * MS) == (None, "outside_span")
    assert (h.counters.frames_with_pose, h.counters.frames_without_pose) == (0, 0)


def test_pose_wait_s_is_checked_and_decides_who_looks_the_pose_up():
    with pytest.raises(ValueError, match="pose_wait_s"):
        PoseConfig(pose_wait_s=-0.1)
    with pytest.raises(ValueError, match="pose_wait_s must be <= 5.0"):
        PoseConfig(pose_wait_s=6.0)
    assert PoseConfig().pose_wait_s == 0.5 and PoseConfig(pose_wait_s=0.25).topic_wait_ns == 250 * MS
    topic = PoseConfig(pose_topic="odom")
    assert (topic.parks_frames, topic.worker_looks_up) == (True, False)
    no_wait = PoseConfig(pose_topic="odom", pose_wait_s=0.0)
    assert (no_wait.parks_frames, no_wait.worker_looks_up) == (False, True)  # the worker looks it up at ingest
    assert (PoseConfig().parks_frames, PoseConfig().worker_looks_up) == (False, False)  # no pose topic: no poses
    tf = PoseConfig(pose_source="tf", pose_wait_s=0.0)
    assert (tf.parks_frames, tf.worker_looks_up) == (True, False)  # tf always parks (pose_tf_wait_s)
