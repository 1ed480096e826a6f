"""A robot pose, and how to interpolate between two: position linearly, orientation by slerp.

Plain Python (``math`` only): the memory stores a pose with each frame's block, the
ingest side keeps a pose history, evaluation compares them; none of them needs ROS.
Quaternions are (x, y, z, w), as geometry_msgs/Quaternion orders them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Vec3 = tuple[float, float, float]
Quat = tuple[float, float, float, float]  # (x, y, z, w)

# Below this angle between two unit quaternions (dot above cos of it), slerp's sin(theta)
# in the denominator loses precision; normalised linear interpolation is then exact to
# within ~1e-9 and is used instead (the usual guard, e.g. Eigen's and tf2's).
_NLERP_DOT = 0.9995


@dataclass(frozen=True, slots=True)
class Pose:
    """Where the robot's base was, in ``frame_id`` (the odometry's or the tf target frame).

    Invariant: every number is finite and ``orientation`` is a unit quaternion (built with
    ``Pose.make``, which checks and normalises; the fields are never changed after).
    """

    frame_id: str  # the frame the pose is expressed in (e.g. "odom", "map")
    position: Vec3  # metres
    orientation: Quat  # unit quaternion (x, y, z, w)

    @staticmethod
    def make(frame_id: str, position, orientation) -> "Pose":
        """A checked pose: raises ValueError on a non-finite number or a zero quaternion."""
        p = tuple(float(v) for v in position)
        q = tuple(float(v) for v in orientation)
        if len(p) != 3 or len(q) != 4:
            raise ValueError("a pose needs 3 position and 4 orientation numbers")
        if not all(math.isfinite(v) for v in p + q):
            raise ValueError(f"pose has a non-finite value: position {p}, orientation {q}")
        norm = math.sqrt(sum(v * v for v in q))
        if norm < 1e-9:
            raise ValueError(f"orientation {q} is not a rotation (zero quaternion)")
        return Pose(str(frame_id), p, tuple(v / norm for v in q))  # type: ignore[arg-type]

    def as_dict(self) -> dict:
        """JSON form (snapshots, evaluation results)."""
        return {"frame_id": self.frame_id, "position": list(self.position), "orientation": list(self.orientation)}

    @staticmethod
    def from_dict(d: dict) -> "Pose":
        return Pose.make(d["frame_id"], d["position"], d["orientation"])


def lerp(a: Vec3, b: Vec3, t: float) -> Vec3:
    """a + t (b - a), per coordinate."""
    return tuple(x + t * (y - x) for x, y in zip(a, b))  # type: ignore[return-value]


def slerp(a: Quat, b: Quat, t: float) -> Quat:
    """Spherical linear interpolation of unit quaternions, along the shorter arc.

    q and -q are the same rotation: when a . b < 0, b is negated so the path is the
    short one (at most 180 degrees of rotation). t = 0 gives a, t = 1 gives b (up to sign).
    """
    dot = sum(x * y for x, y in zip(a, b))
    if dot < 0.0:
        b, dot = tuple(-v for v in b), -dot  # type: ignore[assignment]
    if dot > _NLERP_DOT:
        q = tuple(x + t * (y - x) for x, y in zip(a, b))
    else:
        theta = math.acos(min(dot, 1.0))
        s = math.sin(theta)
        wa, wb = math.sin((1.0 - t) * theta) / s, math.sin(t * theta) / s
        q = tuple(wa * x + wb * y for x, y in zip(a, b))
    norm = math.sqrt(sum(v * v for v in q))
    return tuple(v / norm for v in q)  # type: ignore[return-value]


def interpolate(a: Pose, b: Pose, t: float) -> Pose:
    """The pose a fraction ``t`` in [0, 1] of the way from ``a`` to ``b`` (same frame)."""
    if a.frame_id != b.frame_id:
        raise ValueError(f"cannot interpolate between frames {a.frame_id!r} and {b.frame_id!r}")
    return Pose(a.frame_id, lerp(a.position, b.position, t), slerp(a.orientation, b.orientation, t))


def yaw_quaternion(yaw: float) -> Quat:
    """The rotation by ``yaw`` radians about z (a ground robot's heading)."""
    return (0.0, 0.0, math.sin(yaw / 2.0), math.cos(yaw / 2.0))


def quaternion_angle(a: Quat, b: Quat) -> float:
    """The rotation angle in radians between two unit quaternions, in [0, pi]."""
    dot = abs(sum(x * y for x, y in zip(a, b)))
    return 2.0 * math.acos(min(dot, 1.0))
