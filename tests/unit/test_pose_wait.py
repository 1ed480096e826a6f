"""Frames parked until their pose resolves (ingest/pose_wait.py): exact release steps on a hand-driven clock,
and a property: every item leaves exactly once, each key in parking order, none later than its wait."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from videokv_node.ingest.pose_history import PoseConfig, PoseCounters
from videokv_node.ingest.pose_wait import PoseWait
from videokv_node.pose import Pose

MS = 1_000_000
ID = (0.0, 0.0, 0.0, 1.0)


class FakeTf:
    """Transforms known up to ``newest_ns``: a stamp resolves once it is not after it; the pose's x is the stamp."""

    def __init__(self, newest_ns: int = -1) -> None:
        self.newest_ns = newest_ns
        self.settled: list[int] = []

    def resolve(self, stamp_ns: int) -> Pose | None:
        return Pose.make("map", (stamp_ns / MS, 0.0, 0.0), ID) if stamp_ns <= self.newest_ns else None

    def settle(self, stamp_ns: int):
        self.settled.append(stamp_ns)
        return None, "late"


def names(out):
    return [(r.item, r.reason) for r in out]


def test_a_frame_newer_than_the_newest_transform_waits_and_leaves_with_its_pose_once_it_arrives():
    tf, w = FakeTf(newest_ns=100 * MS), PoseWait(500 * MS, capacity=8)
    w.park("cam", 120 * MS, "f1", now_ns=0)
    assert w.release(tf.resolve, tf.settle, now_ns=0) == [] and len(w) == 1  # 20 ms ahead of tf: parked
    tf.newest_ns = 150 * MS  # the next transform arrives
    (r,) = w.release(tf.resolve, tf.settle, now_ns=50 * MS)
    assert (r.item, r.reason, r.pose.position[0], r.waited_ns, r.waited) == ("f1", "resolved", 120.0, 50 * MS, True)
    assert len(w) == 0 and tf.settled == []


def test_a_frame_whose_transform_is_there_leaves_at_once_without_having_waited():
    tf, w = FakeTf(newest_ns=100 * MS), PoseWait(500 * MS, capacity=8)
    w.park("cam", 90 * MS, "f1", now_ns=7)
    (r,) = w.release(tf.resolve, tf.settle, now_ns=7)
    assert (r.item, r.reason, r.waited_ns, r.waited) == ("f1", "resolved", 0, False)


def test_a_frame_whose_transform_never_comes_leaves_at_its_deadline_with_settles_answer():
    tf, w = FakeTf(newest_ns=100 * MS), PoseWait(500 * MS, capacity=8)
    w.park("cam", 300 * MS, "f1", now_ns=0)
    assert w.release(tf.resolve, tf.settle, now_ns=499 * MS) == []
    (r,) = w.release(tf.resolve, tf.settle, now_ns=500 * MS)
    assert (r.item, r.pose, r.reason, r.waited_ns) == ("f1", None, "late", 500 * MS) and tf.settled == [300 * MS]


def test_a_later_frame_of_the_same_camera_never_overtakes_a_parked_one_but_another_cameras_does():
    tf, w = FakeTf(newest_ns=100 * MS), PoseWait(500 * MS, capacity=8)
    w.park("a", 200 * MS, "a1", now_ns=0)  # tf far behind
    w.park("a", 90 * MS, "a2", now_ns=0)  # resolvable, but behind a1 of the same camera
    w.park("b", 95 * MS, "b1", now_ns=0)  # another camera: goes on
    assert names(w.release(tf.resolve, tf.settle, now_ns=0)) == [("b1", "resolved")]
    out = w.release(tf.resolve, tf.settle, now_ns=500 * MS)
    assert names(out) == [("a1", "late"), ("a2", "resolved")] and [r.waited for r in out] == [True, True]


def test_beyond_capacity_the_oldest_leave_early_and_are_counted():
    tf, w = FakeTf(), PoseWait(500 * MS, capacity=2)
    for i in range(4):
        w.park(f"cam{i}", i * MS, f"f{i}", now_ns=0)
    assert names(w.release(tf.resolve, tf.settle, now_ns=0)) == [("f0", "late"), ("f1", "late")]
    assert w.overflowed == 2 and len(w) == 2


def test_a_clock_jumping_back_lets_everything_parked_before_it_go():
    tf, w = FakeTf(), PoseWait(500 * MS, capacity=8)
    w.park("cam", 5 * MS, "f1", now_ns=10_000 * MS)
    (r,) = w.release(tf.resolve, tf.settle, now_ns=3 * MS)  # a bag loop: sim time restarted
    assert (r.item, r.reason, r.waited_ns) == ("f1", "late", 0)


def test_no_wait_settles_at_once_and_drain_returns_what_is_left_in_order():
    tf, w = FakeTf(), PoseWait(0, capacity=8)
    w.park("cam", 5 * MS, "f1", now_ns=0)
    assert names(w.release(tf.resolve, tf.settle, now_ns=0)) == [("f1", "late")]
    w2 = PoseWait(500 * MS, capacity=8)
    for i in range(3):
        w2.park("cam", i, f"f{i}", now_ns=0)
    assert w2.drain() == ["f0", "f1", "f2"] and len(w2) == 0


def test_bad_arguments_and_parameters_are_refused():
    with pytest.raises(ValueError):
        PoseWait(-1, 8)
    with pytest.raises(ValueError):
        PoseWait(0, 0)
    with pytest.raises(ValueError, match="pose_tf_wait_s"):
        PoseConfig(pose_tf_wait_s=-0.1)
    with pytest.raises(ValueError, match="pose_tf_wait_s must be <= 5.0"):
        PoseConfig(pose_tf_wait_s=6.0)
    assert PoseConfig().pose_tf_wait_s == 0.5 and PoseConfig(pose_tf_wait_s=0.25).tf_wait_ns == 250 * MS


def test_counters_keep_frames_without_pose_as_the_sum_of_its_reasons():
    c = PoseCounters()
    c.count_frame(None, "late")
    c.count_frame(None, "late")
    c.count_frame(None, "no_transform")
    c.count_frame(Pose.make("map", (0.0, 0.0, 0.0), ID), "resolved")
    assert (c.frames_with_pose, c.frames_without_pose, c.without_pose) == (1, 3, {"late": 2, "no_transform": 1})


events = st.lists(st.one_of(
    st.tuples(st.just("park"), st.sampled_from("abc"), st.integers(0, 2000)),  # camera, stamp (ms)
    st.tuples(st.just("tf"), st.integers(0, 2000)),  # tf catches up to this stamp (ms)
    st.tuples(st.just("tick"), st.integers(0, 400)),  # the clock advances (ms), then release
), max_size=60)


@settings(max_examples=200, deadline=None)
@given(events, st.integers(1, 6), st.integers(0, 600))
def test_every_item_leaves_once_in_order_per_camera_and_no_later_than_its_wait(steps, capacity, wait_ms):
    tf, w = FakeTf(), PoseWait(wait_ms * MS, capacity)
    now, parked_at, order, out = 0, {}, {}, []
    for step in steps:
        if step[0] == "park":
            item = len(parked_at)
            parked_at[item] = now
            order.setdefault(step[1], []).append(item)
            w.park(step[1], step[2] * MS, item, now)
        elif step[0] == "tf":
            tf.newest_ns = max(tf.newest_ns, step[1] * MS)
        else:
            now += step[1] * MS
        released = w.release(tf.resolve, tf.settle, now)
        out += [r.item for r in released]
        assert len(w) <= capacity
        for r in released:
            assert (r.pose is None) == (r.reason == "late") and r.waited_ns == now - parked_at[r.item]
        still = [i for i in parked_at if i not in out]
        assert len(still) == len(w) and all(now - parked_at[i] < wait_ms * MS for i in still)  # none past its wait
    out += w.drain()
    assert sorted(out) == list(parked_at)  # each exactly once
    for items in order.values():
        assert [i for i in out if i in items] == items  # one camera's items in parking order
