"""Where an answer's evidence was seen against where the truth was: a small map per question in the evaluation report.

A replay passes every odometry message of the bag (``ImageBag.relay``) through ``PoseTrack``, the robot's path in the
odometry's frame. For each answered question, ``question_map`` places the answer's evidence stamps and the truth's
stamps (the question file's ``evidence_stamps``, else its ``time_spans`` as the path's poses inside them) on that path,
interpolated at each stamp: both from the same odometry, so they compare in one frame whatever pose source the node
used (its own evidence poses are in results.csv). ``draw_map`` draws one, small. No ROS: the messages are read with
rosbags, as the bag is.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from videokv_node.eval.bag_io import TYPESTORE, BagMessage
from videokv_node.ingest.sampler import NS_PER_S

POSE_TYPES = ("nav_msgs/msg/Odometry", "geometry_msgs/msg/PoseStamped", "geometry_msgs/msg/PoseWithCovarianceStamped")
MAX_PATH_POINTS = 400  # the path is drawn through at most this many of its poses


class PoseTrack:
    """The robot's (x, y) over time from one pose topic of a bag: the first pose topic a message came on.

    Invariant: stamps ascend (a message older than the newest is ignored: a bag's odometry is in order).
    """

    def __init__(self) -> None:
        self.topic = ""  # the pose topic followed, set by its first message
        self.stamps: list[int] = []  # header stamps (ns), ascending
        self.xy: list[tuple[float, float]] = []

    def __len__(self) -> int:
        return len(self.stamps)

    def add(self, message: BagMessage) -> None:
        """Follow ``message`` if it is a pose of the followed topic (any other relayed message is ignored)."""
        if message.msgtype not in POSE_TYPES or (self.topic and message.topic != self.topic):
            return
        msg = TYPESTORE.deserialize_cdr(message.raw, message.msgtype)
        pose = msg.pose if message.msgtype == "geometry_msgs/msg/PoseStamped" else msg.pose.pose
        stamp = int(msg.header.stamp.sec) * NS_PER_S + int(msg.header.stamp.nanosec) or message.bag_time_ns
        self.add_pose(stamp, float(pose.position.x), float(pose.position.y), message.topic)

    def add_pose(self, stamp_ns: int, x: float, y: float, topic: str = "poses") -> None:
        self.topic = self.topic or topic
        if self.stamps and stamp_ns <= self.stamps[-1]:
            return
        self.stamps.append(stamp_ns)
        self.xy.append((x, y))

    def at(self, stamp_ns: int) -> tuple[float, float] | None:
        """(x, y) linearly interpolated at ``stamp_ns``; None outside the track (no extrapolation)."""
        i = bisect.bisect_left(self.stamps, stamp_ns)
        if i == len(self.stamps) or (i == 0 and self.stamps[0] != stamp_ns):
            return None
        if self.stamps[i] == stamp_ns:
            return self.xy[i]
        (t0, (x0, y0)), (t1, (x1, y1)) = (self.stamps[i - 1], self.xy[i - 1]), (self.stamps[i], self.xy[i])
        w = (stamp_ns - t0) / (t1 - t0)
        return x0 + w * (x1 - x0), y0 + w * (y1 - y0)

    def between(self, start_ns: int, end_ns: int) -> list[tuple[float, float]]:
        """The poses stamped in [start_ns, end_ns)."""
        lo, hi = bisect.bisect_left(self.stamps, start_ns), bisect.bisect_left(self.stamps, end_ns)
        return self.xy[lo:hi]

    def path(self) -> list[tuple[float, float]]:
        """At most ``MAX_PATH_POINTS`` poses, evenly over the track, first and last included."""
        n = len(self.xy)
        if n <= MAX_PATH_POINTS:
            return list(self.xy)
        return [self.xy[round(i * (n - 1) / (MAX_PATH_POINTS - 1))] for i in range(MAX_PATH_POINTS)]


@dataclass(slots=True)
class QuestionMap:
    """One question's map: positions in the track's frame (metres)."""

    title: str
    evidence: list[tuple[float, float]] = field(default_factory=list)  # the answer's evidence stamps on the path
    truth: list[tuple[float, float]] = field(default_factory=list)  # the truth's stamps (or spans) on the path
    path: list[tuple[float, float]] = field(default_factory=list)
    off_track: int = 0  # evidence stamps outside the track (no pose to draw)

    @property
    def nearest_m(self) -> float | None:
        """Distance from the truth to the nearest evidence position; None without both."""
        if not self.evidence or not self.truth:
            return None
        return min(math.dist(e, t) for e in self.evidence for t in self.truth)


def question_map(title: str, evidence_ns: list[int], truth_ns: list[int], spans_ns: list[tuple[int, int]],
                 track: PoseTrack) -> QuestionMap:
    """The map of one answer: its evidence stamps and the truth's stamps (else its spans' poses) placed on ``track``."""
    placed = [track.at(s) for s in evidence_ns]
    truth = [p for p in (track.at(s) for s in truth_ns) if p is not None]
    if not truth_ns:
        truth = [p for a, b in spans_ns for p in track.between(a, b)]
    return QuestionMap(title, [p for p in placed if p is not None], truth, track.path(),
                       sum(p is None for p in placed))


def draw_map(qm: QuestionMap):
    """A small matplotlib figure of ``qm`` (the caller saves and closes it): the path grey, the truth as green squares,
    the evidence as red crosses; the axes hold them in that order (a line, then two scatter collections)."""
    import matplotlib

    matplotlib.use("Agg")  # files only: never a display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3.4, 3.2))
    if qm.path:
        ax.plot(*zip(*qm.path), color="0.7", lw=1.0, label="path")
    ax.scatter([p[0] for p in qm.truth], [p[1] for p in qm.truth], marker="s", s=40, facecolors="none",
               edgecolors="tab:green", lw=1.2, label="truth")
    ax.scatter([p[0] for p in qm.evidence], [p[1] for p in qm.evidence], marker="x", s=30, color="tab:red",
               lw=1.2, label="evidence")
    ax.set_aspect("equal", adjustable="datalim")
    ax.grid(True, lw=0.3, color="0.9")
    ax.tick_params(labelsize=7)
    near = qm.nearest_m
    ax.set_title(qm.title[:48] + ("" if near is None else f"\nnearest evidence {near:.1f} m from the truth"), fontsize=8)
    ax.legend(fontsize=6, loc="best")
    return fig
