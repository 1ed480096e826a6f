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
``pose_tf_wait_s / 5`` (at most 50 ms) while frames are parked (ros/pose_parking.py, shared
with topic poses). The model worker never looks
tf up, so questions never wait for it. The listener's subscriptions spin on the node's
executor (``spin_thread=False``), like every other subscription of the node. A jump back of the
node clock (a bag loop under ``use_sim_time``) clears the buffer and lets the parked frames go.
"""

from __future__ import annotations

from collections.abc import Callable

from rclpy.clock import JumpThreshold
from rclpy.duration import Duration
from rclpy.node import Node
from rclpy.time import Time

from videokv_node.ingest.pose_history import PoseConfig, PoseCounters
from videokv_node.ingest.pose_wait import Released
from videokv_node.pose import Pose
from videokv_node.ros.conversions import time_to_ns
from videokv_node.ros.pose_parking import PoseParking

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
        self._config = config
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
        # Frames parked until the transform at their stamp is there (ros/pose_parking.py: a timer retries them).
        self._parking = PoseParking(node, config.tf_wait_ns, capacity, counters, self.lookup, self.settle, deliver)

    @property
    def parked(self) -> int:
        """Frames waiting for their transform now."""
        return self._parking.parked

    def submit(self, camera: str, stamp_ns: int, frame) -> bool:
        """Park a sampled frame and try at once: delivered now if its transform is there, else later.
        False, with nothing parked, once destroyed (a frame racing a deactivation: the caller drops it)."""
        return self._parking.submit(camera, stamp_ns, frame)

    def release(self) -> None:
        """Deliver every parked frame whose transform is there or whose wait is over."""
        self._parking.release()

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
        return self._parking.drop_parked()

    def destroy(self) -> list:
        """Stop retrying and listening; the frames still parked, undelivered (the caller counts them)."""
        left = self._parking.close()
        self._listener.unregister()
        self._jump.unregister()
        return left

    def _transform(self, at: Time):
        return self._buffer.lookup_transform_core(self._config.pose_frame, self._config.base_frame, at)

    def _pose(self, t) -> Pose:
        tr, rot = t.transform.translation, t.transform.rotation
        return Pose.make(self._config.pose_frame, (tr.x, tr.y, tr.z), (rot.x, rot.y, rot.z, rot.w))
