"""Sampled frames parked until their pose is known, on the node clock: the ROS side of ``ingest/pose_wait.py``.

Both pose sources park frames here: tf (ros/tf_poses.py: resolved once the tf2 buffer has the
transform at the frame's stamp) and a pose topic with ``pose_wait_s`` > 0 (ros/pose_intake.py:
resolved once a pose at or after the stamp has arrived, so the history interpolates). A frame
leaves as soon as ``resolve`` gives its pose, or when its wait is over with what ``settle``
gives; either way counted (``PoseCounters``) and handed to ``deliver`` (on to the model worker).

Nothing waits on a thread: ``submit`` parks and tries at once (a frame whose pose is already
known goes straight on), the source calls ``release`` when something new arrives (the pose
callback), and a timer on its own callback group retries every ``wait / 5`` (at most 50 ms)
so a frame leaves at most that long after its wait is over. The model worker never waits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node

from videokv_node.ingest.pose_history import PoseCounters
from videokv_node.ingest.pose_wait import PoseWait, Released
from videokv_node.pose import Pose

TICK_MAX_S = 0.05  # the retry period's ceiling: a frame leaves at most this long after its wait is over


class PoseParking:
    """Frames parked until ``resolve(stamp)`` gives their pose or ``wait_ns`` passes on the node clock.

    ``deliver`` is called once per submitted frame (from the submitter's, the pose callback's or the
    timer's thread, one at a time: a camera's frames in stamp order) until ``close``.
    """

    def __init__(self, node: Node, wait_ns: int, capacity: int, counters: PoseCounters,
                 resolve: Callable[[int], Pose | None], settle: Callable[[int], tuple[Pose | None, str]],
                 deliver: Callable[[Released], None]) -> None:
        self._node, self._counters, self._deliver = node, counters, deliver
        self._resolve, self._settle = resolve, settle
        self._wait = PoseWait(wait_ns, capacity)
        self._lock = threading.Lock()  # serialises park, release and delivery (a camera's frames stay in order)
        self._closed = False  # set by close, under _lock: nothing is parked after it
        self._timer = None
        if wait_ns > 0:
            self._timer = node.create_timer(min(TICK_MAX_S, wait_ns / 5e9), self.release,
                                            callback_group=MutuallyExclusiveCallbackGroup())

    @property
    def parked(self) -> int:
        """Frames waiting for their pose now."""
        return len(self._wait)

    def submit(self, camera: str, stamp_ns: int, frame) -> bool:
        """Park a sampled frame and try at once: delivered now if its pose is known, else later.
        False, with nothing parked, once closed (a frame racing a deactivation: the caller drops it)."""
        with self._lock:
            if self._closed:
                return False
            self._wait.park(camera, stamp_ns, frame, self._now())
        self.release()
        return True

    def release(self) -> None:
        """Deliver every parked frame whose pose is known or whose wait is over (the timer's and the source's call)."""
        with self._lock:
            if not len(self._wait):
                return
            cut = self._wait.overflowed
            out = self._wait.release(self._resolve, self._settle, self._now())
            self._counters.waits_cut_short += self._wait.overflowed - cut
            for r in out:
                self._counters.count_frame(r.pose, r.reason)
                self._counters.frames_waited += r.waited and r.pose is not None
                self._deliver(r)

    def drop_parked(self) -> int:
        """Forget the parked frames (a memory reset: they were sampled before it); how many."""
        with self._lock:
            return len(self._wait.drain())

    def close(self) -> list:
        """Stop retrying; the frames still parked, undelivered (the caller counts them). Nothing is parked after."""
        if self._timer is not None:
            self._node.destroy_timer(self._timer)
            self._timer = None
        with self._lock:
            self._closed = True
            return self._wait.drain()

    def _now(self) -> int:
        return self._node.get_clock().now().nanoseconds
