"""A bounded history of robot poses by header stamp, and the pose at any frame's stamp.

A planner asking "where did you see X?" needs the robot's pose at the frame's stamp,
long after a TF buffer (about 10 s) has forgotten it. So the node keeps the last
``pose_history_size`` poses of ``pose_topic`` here and, for every sampled frame, reads
the pose at the frame's header stamp; the memory then keeps that pose with the
frame's block for as long as it keeps the frame.

Semantics of ``at(stamp)``:
- inside the history's span: interpolated between the two poses around the stamp
  (position linearly, orientation by slerp: ``videokv_node.pose.interpolate``); an
  exact stamp gives that pose;
- before the oldest or after the newest pose by at most ``pose_tolerance_s``: that
  end's pose (a frame usually arrives a few ms after the latest odometry message);
- further outside: no pose (None); the caller counts it.

A frame parked for its odometry (``pose_wait_s``, ros/pose_parking.py) asks ``resolve``: the
pose once a pose at or after its stamp has arrived, so it is interpolated, not the newest
before it; when its wait is over, ``settle`` gives ``at``'s answer with its reason.

What ``add`` refuses (counted, the history unchanged): a pose with a non-finite number
or a zero quaternion; a stamp not after the newest one (a backwards or repeated
stamp). A stamp more than ``pose_reset_backward_s`` before the newest is a clock reset
(a bag loop, a simulator restart), as for the frame sampler: the history restarts from
it. A pose in another ``frame_id`` than the history's also restarts it (two frames
are never interpolated between). Plain Python: the node passes message fields.
"""

from __future__ import annotations

import bisect
import enum
import math
import threading
from collections import deque
from dataclasses import dataclass, field

from videokv_node.config_base import param
from videokv_node.pose import Pose, interpolate

NS_PER_S = 1_000_000_000
POSE_TYPES = ("auto", "odometry", "pose_stamped", "pose_with_covariance_stamped")
POSE_SOURCES = ("topic", "tf")
# Why a frame got no pose: the keys of PoseCounters.without_pose (and of /diagnostics' "videokv: poses").
WITHOUT_POSE_REASONS = {
    "no_pose_yet": "topic: no pose received yet",
    "outside_span": "topic: further than pose_tolerance_s outside the poses received",
    "no_transform": "tf: no transform pose_frame <- base_frame in the tf tree (a frame unknown or not connected)",
    "late": "tf: after pose_tf_wait_s, still newer than the newest transform by more than pose_tolerance_s",
    "too_old": "tf: older than the transforms the tf buffer still holds",
}
TF_WAIT_MAX_S = 5.0  # a frame waiting longer would outlive the transforms around it in the tf buffer (10 s)
WAIT_MAX_S = 5.0  # pose_wait_s' ceiling: a frame parked longer holds its camera's later frames back as long


@dataclass(frozen=True, slots=True)
class PoseConfig:
    """Where poses come from; the ROS parameters map onto these fields one to one."""

    pose_topic: str = param("", "robot pose topic (nav_msgs/Odometry, geometry_msgs/PoseStamped or PoseWithCovarianceStamped); each sampled frame stores the pose interpolated at its stamp; empty: no poses")
    pose_type: str = param("auto", f"message type of pose_topic: {', '.join(POSE_TYPES)} (auto: as the topic graph shows it; the subscription waits until the topic appears)", choices=POSE_TYPES)
    pose_source: str = param("topic", f"where poses come from: {' or '.join(POSE_SOURCES)} (tf: the transform pose_frame <- base_frame at each frame's stamp, from a tf2_ros buffer)", choices=POSE_SOURCES)
    pose_frame: str = param("map", "pose_source tf: the fixed frame poses are expressed in")
    base_frame: str = param("base_link", "pose_source tf: the robot frame whose pose is stored")
    pose_tolerance_s: float = param(0.1, "a frame at most this far before the oldest or after the newest pose gets that pose; further out it gets none (counted)")
    pose_tf_wait_s: float = param(0.5, f"pose_source tf: how long a sampled frame may wait (node clock) for the transform at its stamp, parked outside the model's queue; then it gets the newest transform if within pose_tolerance_s, else none (counted by reason); 0: no wait; at most {TF_WAIT_MAX_S} s")
    pose_wait_s: float = param(0.5, f"pose_source topic: how long a sampled frame may wait (node clock) for a pose at or after its stamp, parked outside the model's queue (odometry often arrives after the image); then it gets the pose within pose_tolerance_s, else none (counted); 0: no parking, the model worker looks the pose up when it takes the frame; at most {WAIT_MAX_S} s")
    pose_history_size: int = param(2000, "poses kept to interpolate frames' poses from (a frame older than the oldest gets none)")  # 100 s of 20 Hz odometry
    pose_reset_backward_s: float = param(2.0, "a pose stamp jumping back more than this restarts the pose history (clock reset); smaller jumps back are dropped and counted")

    def __post_init__(self) -> None:
        if self.pose_type not in POSE_TYPES:
            raise ValueError(f"pose_type must be one of {POSE_TYPES}, got {self.pose_type!r}")
        if self.pose_source not in POSE_SOURCES:
            raise ValueError(f"pose_source must be one of {POSE_SOURCES}, got {self.pose_source!r}")
        for name in ("pose_tolerance_s", "pose_reset_backward_s", "pose_tf_wait_s", "pose_wait_s"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        if self.pose_tf_wait_s > TF_WAIT_MAX_S:
            raise ValueError(f"pose_tf_wait_s must be <= {TF_WAIT_MAX_S} (the tf buffer's span), got {self.pose_tf_wait_s}")
        if self.pose_wait_s > WAIT_MAX_S:
            raise ValueError(f"pose_wait_s must be <= {WAIT_MAX_S}, got {self.pose_wait_s}")
        if self.pose_history_size < 2:
            raise ValueError(f"pose_history_size must be >= 2 (interpolation needs two poses), got {self.pose_history_size}")
        if self.pose_source == "tf" and not (self.pose_frame and self.base_frame):
            raise ValueError("pose_source tf needs pose_frame and base_frame")

    @property
    def enabled(self) -> bool:
        return self.pose_source == "tf" or bool(self.pose_topic)

    @property
    def tolerance_ns(self) -> int:
        return round(self.pose_tolerance_s * NS_PER_S)

    @property
    def tf_wait_ns(self) -> int:
        return round(self.pose_tf_wait_s * NS_PER_S)

    @property
    def topic_wait_ns(self) -> int:
        return round(self.pose_wait_s * NS_PER_S)

    @property
    def parks_frames(self) -> bool:
        """Sampled frames wait for their pose outside the model's queue (ros/pose_intake.py): always with tf,
        with a pose topic when ``pose_wait_s`` > 0; else the model worker looks the pose up at ingest."""
        return self.pose_source == "tf" or (bool(self.pose_topic) and self.pose_wait_s > 0)

    @property
    def worker_looks_up(self) -> bool:
        """The model worker looks a frame's pose up when it takes it (a pose topic with ``pose_wait_s`` 0)."""
        return self.enabled and not self.parks_frames


class PoseAdd(enum.Enum):
    """What ``PoseHistory.add`` did with one pose."""

    ADDED = "added"
    NON_FINITE = "non_finite"  # dropped: a NaN or infinite number, or a zero quaternion
    BACKWARDS = "backwards"  # dropped: stamp not after the newest (out of order or repeated)
    RESET = "reset"  # added, after clearing the history (clock reset or another frame_id)

    @property
    def kept(self) -> bool:
        return self is PoseAdd.ADDED or self is PoseAdd.RESET


@dataclass(slots=True)
class PoseCounters:
    """Counts since start. Invariants: received == added + non_finite + backwards (resets are added too);
    frames_without_pose == sum(without_pose.values())."""

    received: int = 0
    added: int = 0
    non_finite: int = 0
    backwards: int = 0
    resets: int = 0
    frames_with_pose: int = 0  # frames asked for and given a pose
    frames_without_pose: int = 0  # frames outside the span by more than pose_tolerance_s (or no history)
    without_pose: dict[str, int] = field(default_factory=dict)  # frames_without_pose by reason (WITHOUT_POSE_REASONS' keys)
    frames_waited: int = 0  # parked frames (tf, or topic with pose_wait_s) that got their pose only after waiting for it
    waits_cut_short: int = 0  # parked frames let go before their wait was over because too many were waiting

    def count_frame(self, pose: Pose | None, reason: str) -> None:
        """One frame asked for its pose: with one, or without one for ``reason``."""
        if pose is not None:
            self.frames_with_pose += 1
            return
        self.frames_without_pose += 1
        self.without_pose[reason] = self.without_pose.get(reason, 0) + 1


@dataclass(slots=True)
class _Entry:
    stamp_ns: int
    pose: Pose


class PoseHistory:
    """The last ``pose_history_size`` poses, stamps strictly increasing; safe across threads (one lock)."""

    def __init__(self, config: PoseConfig | None = None) -> None:
        self.config = config if config is not None else PoseConfig()
        self._lock = threading.Lock()
        self._entries: deque[_Entry] = deque(maxlen=self.config.pose_history_size)
        self._stamps: deque[int] = deque(maxlen=self.config.pose_history_size)  # mirrors _entries, for bisect
        self.counters = PoseCounters()

    def __len__(self) -> int:
        return len(self._entries)

    def span_ns(self) -> tuple[int, int] | None:
        """(oldest, newest) stamp held, or None when empty."""
        with self._lock:
            return (self._stamps[0], self._stamps[-1]) if self._stamps else None

    def add(self, stamp_ns: int, frame_id: str, position, orientation) -> PoseAdd:
        """Add one pose by its header stamp; see the module docstring for what is refused."""
        with self._lock:
            self.counters.received += 1
            try:
                pose = Pose.make(frame_id, position, orientation)
            except (ValueError, TypeError):
                self.counters.non_finite += 1
                return PoseAdd.NON_FINITE
            result = PoseAdd.ADDED
            if self._stamps:
                newest = self._stamps[-1]
                frame_changed = pose.frame_id != self._entries[-1].pose.frame_id
                if frame_changed or newest - stamp_ns > round(self.config.pose_reset_backward_s * NS_PER_S):
                    self._entries.clear()
                    self._stamps.clear()
                    self.counters.resets += 1
                    result = PoseAdd.RESET
                elif stamp_ns <= newest:
                    self.counters.backwards += 1
                    return PoseAdd.BACKWARDS
            self._entries.append(_Entry(int(stamp_ns), pose))
            self._stamps.append(int(stamp_ns))
            self.counters.added += 1
            return result

    def at(self, stamp_ns: int) -> Pose | None:
        """The pose at ``stamp_ns`` (module docstring), counted as a frame with or without a pose."""
        pose = self.peek(stamp_ns)
        with self._lock:
            self.counters.count_frame(pose, "outside_span" if self._stamps else "no_pose_yet")
        return pose

    def resolve(self, stamp_ns: int) -> Pose | None:
        """The pose at ``stamp_ns`` once a pose at or after it has arrived (interpolated, or exact), else None:
        a parked frame's ``PoseWait`` resolve (ingest/pose_wait.py); uncounted."""
        with self._lock:
            if not self._stamps or self._stamps[-1] < stamp_ns:
                return None
        return self.peek(stamp_ns)

    def settle(self, stamp_ns: int) -> tuple[Pose | None, str]:
        """A parked frame's final pose once its wait is over, as ``at`` gives it (the nearest end within
        ``pose_tolerance_s``), and why: ``resolved``, ``nearest``, or none for ``no_pose_yet`` or ``outside_span``."""
        pose = self.peek(stamp_ns)
        with self._lock:
            if pose is None:
                return None, "outside_span" if self._stamps else "no_pose_yet"
            return pose, "resolved" if self._stamps[0] <= stamp_ns <= self._stamps[-1] else "nearest"

    def peek(self, stamp_ns: int) -> Pose | None:
        """As ``at``, without counting."""
        tol = self.config.tolerance_ns
        with self._lock:
            if not self._stamps:
                return None
            first, last = self._stamps[0], self._stamps[-1]
            if stamp_ns <= first:
                return self._entries[0].pose if first - stamp_ns <= tol else None
            if stamp_ns >= last:
                return self._entries[-1].pose if stamp_ns - last <= tol else None
            i = bisect.bisect_left(self._stamps, stamp_ns)  # first index with stamp >= stamp_ns; 0 < i < len
            hi = self._entries[i]
            if hi.stamp_ns == stamp_ns:
                return hi.pose
            lo = self._entries[i - 1]
            t = (stamp_ns - lo.stamp_ns) / (hi.stamp_ns - lo.stamp_ns)
            return interpolate(lo.pose, hi.pose, t)

    def clear(self) -> None:
        """Forget every pose (a memory reset); the counters stay."""
        with self._lock:
            self._entries.clear()
            self._stamps.clear()

