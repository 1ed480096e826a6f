"""The node's robot poses: a pose topic into a ``PoseHistory``, or tf lookups, and the pose at a frame's stamp.

``pose_source: topic`` subscribes to ``pose_topic`` (nav_msgs/Odometry,
geometry_msgs/PoseStamped or PoseWithCovarianceStamped; with ``pose_type: auto`` the
type is read from the topic graph, and the subscription waits, retried every second,
until a publisher shows it). Each message goes to the history (ingest/pose_history.py),
which drops and counts a non-finite pose or a stamp going backwards. Odometry often arrives
after the image it belongs to (a bag replayed best effort, a busy robot), so with
``pose_wait_s`` > 0 (the default) the camera callback hands each sampled frame to ``park``
(ros/pose_parking.py) and the frame reaches the model worker, its pose set, once a pose at or
after its stamp has arrived (interpolated between the two around it), or after ``pose_wait_s``
on the node clock: then the nearest pose within ``pose_tolerance_s``, or none, counted by
reason. Each pose message retries the parked frames. With ``pose_wait_s`` 0 nothing is parked:
the model worker calls ``pose_at`` when it takes the frame for ingest (``camera_intake.FrameRoute.pose_at_ingest``,
runtime/worker.py), and a frame taken before the odometry past its stamp gets the newest pose
within ``pose_tolerance_s``, or none.

``pose_source: tf`` takes ``pose_frame <- base_frame`` at the frame's stamp from a tf2
buffer instead (ros/tf_poses.py): the camera callback hands each sampled frame to ``park``,
and the frame reaches the model worker, its pose set, once the transform at its stamp has
arrived or after ``pose_tf_wait_s`` (then the newest transform within ``pose_tolerance_s``,
or none, counted by reason). The worker never looks tf up. tf2_ros comes with ROS 2 from
apt; with the wheels set-up ``make build`` builds it from ../shared/ros2tools and env.sh
puts it on the path. Where it cannot be imported, ``check_available`` refuses tf at configure.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.subscription import Subscription
from rclpy.timer import Timer

from videokv_node.frame import Frame
from videokv_node.ingest.pose_history import PoseAdd, PoseConfig, PoseCounters, PoseHistory
from videokv_node.ingest.pose_wait import Released
from videokv_node.memory.config import ConfigError
from videokv_node.pose import Pose
from videokv_node.ros.conversions import pose_fields
from videokv_node.ros.pose_parking import PoseParking

if TYPE_CHECKING:
    from videokv_node.ros.tf_poses import TfPoses  # imports tf2_ros: at run time only with pose_source tf

# pose_type -> ROS type name as the topic graph lists it
TYPE_NAMES = {
    "odometry": "nav_msgs/msg/Odometry",
    "pose_stamped": "geometry_msgs/msg/PoseStamped",
    "pose_with_covariance_stamped": "geometry_msgs/msg/PoseWithCovarianceStamped",
}
WARN_THROTTLE_S = 5.0
RETRY_S = 1.0
# Best effort receives from reliable and best-effort publishers alike; odometry is small and frequent.
QOS = QoSProfile(depth=50, reliability=ReliabilityPolicy.BEST_EFFORT)


def message_class(pose_type: str):
    """The message class of a ``pose_type`` other than auto."""
    if pose_type == "odometry":
        from nav_msgs.msg import Odometry

        return Odometry
    from geometry_msgs.msg import PoseStamped, PoseWithCovarianceStamped

    return PoseStamped if pose_type == "pose_stamped" else PoseWithCovarianceStamped


def tf2_available() -> bool:
    return importlib.util.find_spec("tf2_ros") is not None


def check_available(config: PoseConfig) -> None:
    """Raise ConfigError when ``config`` cannot work here (tf without tf2_ros)."""
    if config.pose_source == "tf" and not tf2_available():
        raise ConfigError("pose_source tf needs tf2_ros (ROS 2 from apt; with the PyPI wheels, `make build` builds it "
                          "from ../shared/ros2tools and env.sh puts it on the path): use pose_source topic with pose_topic")


class PoseIntake:
    """Poses for the node's frames. ``pose_at`` and ``park`` are safe from any callback thread.

    ``deliver(frame)`` (when ``parks_frames``: tf, or a pose topic with ``pose_wait_s`` > 0) queues a
    frame whose pose is resolved for the model worker; at most ``capacity`` frames wait for their pose
    (the oldest beyond go on early, counted).
    """

    def __init__(self, node: Node, config: PoseConfig, deliver: Callable[[Frame], None] | None = None,
                 capacity: int = 8, drop: Callable[[str], None] | None = None) -> None:
        check_available(config)
        self._node = node
        self.config = config
        self.history = PoseHistory(config)
        self._sub: Subscription | None = None
        self._timer: Timer | None = None
        self._tf: TfPoses | None = None
        self._parking: TfPoses | PoseParking | None = None  # when parks_frames
        # A frame dropped (the node's ``drop``: counted, warned); a warning alone where none is given.
        self._drop = drop if drop is not None else lambda message: node.get_logger().warn(message)
        self.last_frame_had_pose: bool | None = None  # None until a frame asks (/diagnostics "videokv: poses")
        self._group = MutuallyExclusiveCallbackGroup()
        if config.parks_frames and deliver is None:
            raise ValueError("parked frames need deliver: frames wait for their pose outside the worker")
        self._deliver = deliver
        if config.pose_source == "tf":
            from videokv_node.ros.tf_poses import TfPoses  # noqa: PLC0415: imports tf2_ros

            self._tf = self._parking = TfPoses(node, config, self.history.counters, capacity, self._released)
            node.get_logger().info(f"poses from tf: {config.pose_frame} <- {config.base_frame} at each frame's stamp "
                                   f"(waiting up to pose_tf_wait_s {config.pose_tf_wait_s} s for it)")
            return
        self._topic = node.resolve_topic_name(config.pose_topic)
        if config.parks_frames:
            self._parking = PoseParking(node, config.topic_wait_ns, capacity, self.history.counters,
                                        self.history.resolve, self.history.settle, self._released)
        if not self._try_subscribe():
            node.get_logger().info(f"pose topic {self._topic}: waiting for a publisher to learn its type (pose_type auto)")
            self._timer = node.create_timer(RETRY_S, self._retry, callback_group=self._group)

    @property
    def counters(self) -> PoseCounters:
        return self.history.counters

    @property
    def parks_frames(self) -> bool:
        """Sampled frames go to ``park``, not straight to the worker (which then looks nothing up):
        ``config.parks_frames`` (tf, or a pose topic with ``pose_wait_s`` > 0)."""
        return self.config.parks_frames

    @property
    def frames_parked(self) -> int:
        """Frames waiting for their pose now (0 when nothing is parked)."""
        parking = self._parking
        return parking.parked if parking is not None else 0

    def park(self, frame: Frame) -> None:
        """Hold a sampled frame until its pose is known (the transform at its stamp, or a pose at or after it)
        or its wait (pose_tf_wait_s, pose_wait_s) has passed, then ``deliver`` it with its pose; never blocks."""
        parking = self._parking  # a local: destroy clears it
        if parking is None or not parking.submit(frame.camera, frame.stamp_ns, frame):
            self._drop(f"dropped a frame from {frame.camera}: the node is being deactivated")

    def drop_parked(self) -> int:
        """Forget the frames waiting for their pose (a memory reset); how many."""
        parking = self._parking
        return parking.drop_parked() if parking is not None else 0

    def pose_at(self, stamp_ns: int) -> Pose | None:
        """The robot's pose at a frame's stamp from the pose topic, or None (counted, warned at most every few seconds)."""
        pose = self.history.at(stamp_ns)
        self._note(stamp_ns, pose, "no pose received yet" if self.history.span_ns() is None else "outside the poses")
        return pose

    def _released(self, r: Released) -> None:
        """A parked frame leaves with its pose (or none, for ``r.reason``), on to the worker."""
        self._note(r.stamp_ns, r.pose, f"{self.config.pose_source} {r.reason}")
        r.item.pose = r.pose
        deliver = self._deliver
        assert deliver is not None  # __init__ refuses parking without it
        deliver(r.item)

    def _note(self, stamp_ns: int, pose: Pose | None, why: str) -> None:
        self.last_frame_had_pose = pose is not None
        if pose is None:
            span = self.history.span_ns()
            where = f"; poses cover [{span[0]}, {span[1]}] ns" if span is not None else ""
            self._node.get_logger().warn(f"a frame stamped {stamp_ns} ns gets no pose ({why}{where}; pose_tolerance_s "
                                         f"{self.config.pose_tolerance_s})", throttle_duration_sec=WARN_THROTTLE_S)

    def peek(self, stamp_ns: int) -> Pose | None:
        """As ``pose_at`` now, uncounted and silent: a provisional pose (the long-replay archive's, until ingest)."""
        return self._tf.lookup(stamp_ns) if self._tf is not None else self.history.peek(stamp_ns)

    def pose_callback(self, msg) -> None:
        """One pose message into the history; a bad one is dropped, counted and warned about."""
        stamp_ns, frame_id, position, orientation = pose_fields(msg)
        result = self.history.add(stamp_ns, frame_id, position, orientation)
        if result is PoseAdd.NON_FINITE:
            self._node.get_logger().warn(f"dropped a pose on {self._topic}: non-finite value or zero quaternion",
                                         throttle_duration_sec=WARN_THROTTLE_S)
        elif result is PoseAdd.BACKWARDS:
            self._node.get_logger().warn(f"dropped a pose on {self._topic}: stamp {stamp_ns} ns not after the newest",
                                         throttle_duration_sec=WARN_THROTTLE_S)
        elif result is PoseAdd.RESET:
            self._node.get_logger().warn(f"pose history restarted on {self._topic} (clock reset or another frame_id)")
        parking = self._parking
        if result.kept and parking is not None:
            parking.release()  # the frames this pose covers go on now, not at the next tick

    def destroy(self) -> None:
        if self._timer is not None:
            self._node.destroy_timer(self._timer)
        if self._sub is not None:
            self._node.destroy_subscription(self._sub)
        parking = self._parking
        if parking is not None:
            left = parking.close() if isinstance(parking, PoseParking) else parking.destroy()
            for _ in left:
                self._drop("dropped a frame waiting for its pose: the node is being deactivated")
        self._sub = self._timer = self._tf = self._parking = None

    # --- subscription ---------------------------------------------------------
    def _try_subscribe(self) -> bool:
        kind = self.config.pose_type if self.config.pose_type != "auto" else self._graph_type()
        if kind is None:
            return False
        self._sub = self._node.create_subscription(message_class(kind), self._topic, self.pose_callback, QOS,
                                                   callback_group=self._group)
        self._node.get_logger().info(f"poses from {self._topic} ({TYPE_NAMES[kind]})")
        return True

    def _graph_type(self) -> str | None:
        """The pose_type of the topic as the graph shows it; None if absent (or of an unsupported type, logged)."""
        for name, types in self._node.get_topic_names_and_types():
            if name != self._topic:
                continue
            for kind, type_name in TYPE_NAMES.items():
                if type_name in types:
                    return kind
            self._node.get_logger().error(f"pose topic {self._topic} has type {types}, none of {list(TYPE_NAMES.values())}",
                                          throttle_duration_sec=WARN_THROTTLE_S)
        return None

    def _retry(self) -> None:
        if self._sub is None and self._try_subscribe() and self._timer is not None:
            self._node.destroy_timer(self._timer)
            self._timer = None
