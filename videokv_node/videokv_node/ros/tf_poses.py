"""Poses from tf (``pose_source: tf``): ``pose_frame <- base_frame`` at each frame's stamp, waited for off the model thread.

On a robot a camera frame is usually newer than the newest transform: tf arrives at 10-50 Hz,
tens of ms behind the image, so a lookup at the frame's stamp right away would extrapolate and
fail (issue 33: 0 to 2 of 6 frames had a pose). Each sampled frame is therefore parked here
(``ingest/pose_wait.py``) and delivered to the model worker as soon as the transform at its stamp
is in the tf2 buffer (interpolated by tf2 between the transforms around the stamp; static
links hold at every stamp), or after ``pose_tf_wait_s`` on the node clock: then it gets the
newest transform if the frame is at most ``pose_tolerance_s`` past it, else no pose, counted
by reason (``no_transform``, ``late``, ``too_old``: ``PoseCounters.without_pose``).

Nothing waits on a thread: the camera callback parks and tries at once (a frame whose transform
is already there goes straight on), and a timer on its own callback group retries every
``pose_tf_wait_s / 5`` (at most 50 ms) while frames are parked. The model worker never looks
tf up, so questions never wait for it. The listener's subscriptions spin on the node's
executor (``spin_thread=False``), like every other subscription of the node. A jump back of the
node clock (a bag loop under ``use_sim_time``) clears the buffer and lets the parked frames go.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import JumpThreshold
from rclpy.duration import Duration
from rclpy.node import Node
from rclpy.time import Time

from videokv_node.ingest.pose_history import PoseConfig, PoseCounters
from videokv_node.ingest.pose_wait import PoseWait, Released
from videokv_node.pose import Pose
from videokv_node.ros.conversions import time_to_ns

TICK_MAX_S = 0.05  # the retry period's ceiling: a frame leaves at most this long after its transform arrives
BUFFER_MIN_S = 10.0  # tf2's default cache time


class TfPoses:
    """A tf2 buffer and listener, and the frames parked until their transform is there.

    ``submit`` never blocks beyond a few tf2 lookups; ``deliver`` is called once per submitted
    frame (from the caller's or the timer's thread, one at a time, a camera's frames in stamp
    order), with the frame's pose set, until ``destroy``.
    """

    def __init__(self, node: Node, config: PoseConfig, counters: PoseCounters, capacity: int,
                 deliver: Callable[[Released], None]) -> None:
        import tf2_ros  # noqa: PLC0415: ROS 2 from apt, or ../shared/ros2tools' build with the wheels

        self._tf2 = tf2_ros
        self._node, self._config, self._counters, self._deliver = node, config, counters, deliver
        # Long enough that a frame parked for its whole wait still finds the transforms around its stamp.
        cache_s = max(BUFFER_MIN_S, 2 * config.pose_tolerance_s, 2 * config.pose_tf_wait_s)
        self._buffer = tf2_ros.Buffer(cache_time=Duration(seconds=cache_s))
        self._listener = tf2_ros.TransformListener(self._buffer, node, spin_thread=False)
        # A jump back of the node clock (a bag looping under use_sim_time) clears the buffer, as tf2_ros'
        # Buffer does on its own clock: else transforms more than its cache time older than the newest held
        # would be refused as old data until the replay caught up again.
        self._jump = node.get_clock().create_jump_callback(
            JumpThreshold(min_forward=None, min_backward=Duration(seconds=-1), on_clock_change=True),
            post_callback=lambda _jump: self._buffer.clear())
        self._wait = PoseWait(config.tf_wait_ns, capacity)
        self._lock = threading.Lock()  # serialises park, release and delivery (a camera's frames stay in order)
        self._closed = False  # set by destroy, under _lock: nothing is parked after it
        self._timer = None
        if config.pose_tf_wait_s > 0:
            self._timer = node.create_timer(min(TICK_MAX_S, config.pose_tf_wait_s / 5), self.release,
                                            callback_group=MutuallyExclusiveCallbackGroup())

    @property
    def parked(self) -> int:
        """Frames waiting for their transform now."""
        return len(self._wait)

    def submit(self, camera: str, stamp_ns: int, frame) -> bool:
        """Park a sampled frame and try at once: delivered now if its transform is there, else later.
        False, with nothing parked, once destroyed (a frame racing a deactivation: the caller drops it)."""
        with self._lock:
            if self._closed:
                return False
            self._wait.park(camera, stamp_ns, frame, self._now())
        self.release()
        return True

    def release(self) -> None:
        """Deliver every parked frame whose transform is there or whose wait is over (the timer's callback)."""
        with self._lock:
            if not len(self._wait):
                return
            cut = self._wait.overflowed
            out = self._wait.release(self.lookup, self.settle, self._now())
            self._counters.waits_cut_short += self._wait.overflowed - cut
            for r in out:
                self._counters.count_frame(r.pose, r.reason)
                self._counters.frames_waited += r.waited and r.pose is not None
                self._deliver(r)

    def lookup(self, stamp_ns: int) -> Pose | None:
        """The transform at ``stamp_ns`` as a pose if the buffer has it now (interpolated), else None; uncounted."""
        try:
            return self._pose(self._transform(Time(nanoseconds=stamp_ns)))
        except (self._tf2.TransformException, ValueError):
            return None

    def settle(self, stamp_ns: int) -> tuple[Pose | None, str]:
        """The final pose of a frame whose wait is over, and why: ``resolved``, ``nearest`` (the newest transform,
        at most ``pose_tolerance_s`` before the frame), or none for ``no_transform``, ``late`` or ``too_old``."""
        try:
            return self._pose(self._transform(Time(nanoseconds=stamp_ns))), "resolved"
        except (self._tf2.LookupException, self._tf2.ConnectivityException):
            return None, "no_transform"
        except (self._tf2.TransformException, ValueError):
            pass  # extrapolation: the stamp is outside the transforms held
        try:
            newest = self._transform(Time())  # the newest time every link of the chain has
        except (self._tf2.TransformException, ValueError):
            return None, "no_transform"
        newest_ns = time_to_ns(newest.header.stamp)
        if stamp_ns < newest_ns:
            return None, "too_old"
        if stamp_ns - newest_ns <= self._config.tolerance_ns:
            return self._pose(newest), "nearest"
        return None, "late"

    def drop_parked(self) -> int:
        """Forget the parked frames (a memory reset: they were sampled before it); how many."""
        with self._lock:
            return len(self._wait.drain())

    def destroy(self) -> list:
        """Stop listening and retrying; the frames still parked, undelivered (the caller counts them)."""
        if self._timer is not None:
            self._node.destroy_timer(self._timer)
            self._timer = None
        self._listener.unregister()
        self._jump.unregister()
        with self._lock:
            self._closed = True
            return self._wait.drain()

    def _transform(self, at: Time):
        return self._buffer.lookup_transform_core(self._config.pose_frame, self._config.base_frame, at)

    def _pose(self, t) -> Pose:
        tr, rot = t.transform.translation, t.transform.rotation
        return Pose.make(self._config.pose_frame, (tr.x, tr.y, tr.z), (rot.x, rot.y, rot.z, rot.w))

    def _now(self) -> int:
        return self._node.get_clock().now().nanoseconds
