"""The memory on the map, as marker content: what ``~/memory_markers`` and ``~/answer_markers`` draw (no ROS).

``memory_markers`` draws a ``MemoryView`` in four namespaces, each thing with an id that stays its own
for as long as it is in memory, so RViz and Foxglove update a marker rather than redraw the scene:

- ``videokv/path`` (id 0): the robot's path over the span the memory holds, a line through the pose of
  every frame held (still spans' ends included), in stamp order, at most ``max_path_points``;
- ``videokv/frames`` (id = block id): each frame in memory as a sphere at the pose it was seen from,
  green where its KV is resident on the model's device, orange where it is offloaded to the host arena,
  darker the older it is (from full brightness for the newest stamp held down to 40 % for the oldest);
- ``videokv/still`` (id = block id): each still span (frames merged into one block, memory/frames/still.py)
  as one segment from the pose of its first frame to the pose of its last, rising 2 cm a second still
  (at most 2 m), so a robot that stood still shows how long;
- ``videokv/words`` (id = the first block of the sighting): each sighting of a named thing, a run of
  one camera's consecutive frames whose words (the model's nouns) are the same, as a view-facing text
  label above the pose it was first seen from.

At most ``max_frames`` frames are drawn (spheres and still spans), evenly spread over the memory's span
with its oldest and newest always; at most ``max_labels`` sightings, the newest. ``MarkerBook`` turns
successive drawings into updates: a thing no longer drawn (it left memory, or the cap passed it by) gets
a ``delete``. Ages are read from header stamps, never a clock: the same memory draws the same markers.
Frames with no pose, or a pose in another frame than the newest pose's, are not drawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import groupby

from videokv_node.node_settings import MarkerSettings
from videokv_node.pose import Pose
from videokv_node.view.memory_view import OFFLOADED, RESIDENT, FrameView, MemoryView

Vec3 = tuple[float, float, float]
RGBA = tuple[float, float, float, float]

NS_PATH, NS_FRAMES, NS_STILL, NS_WORDS = "videokv/path", "videokv/frames", "videokv/still", "videokv/words"
NS_EVIDENCE, NS_EVIDENCE_TEXT = "videokv/answer", "videokv/answer_text"
TIER_RGB = {RESIDENT: (0.10, 0.80, 0.25), OFFLOADED: (1.00, 0.55, 0.10)}  # where a frame's KV lives
PATH_RGBA: RGBA = (0.55, 0.55, 0.60, 1.0)
STILL_RGBA: RGBA = (0.20, 0.45, 1.00, 1.0)
WORDS_RGBA: RGBA = (1.0, 1.0, 1.0, 1.0)
EVIDENCE_RGBA: RGBA = (0.90, 0.10, 0.90, 1.0)
OLDEST_BRIGHTNESS = 0.4  # the oldest frame's colour, as a share of the newest's
STILL_RISE_M_PER_S, STILL_RISE_MAX_M = 0.02, 2.0
LABEL_LIFT_M = 0.5  # labels float this far above the pose
LINE_WIDTH_SHARE = 0.3  # lines are this share of a point's size wide
MAX_LABEL_CHARS = 60


@dataclass(frozen=True, slots=True)
class MarkerSpec:
    """One marker's content, as ``visualization_msgs/Marker`` holds it; ``ros/memory_view.py`` converts it.

    ``kind`` is ``sphere``, ``line_strip``, ``text`` (view facing), ``delete`` or ``delete_all``.
    """

    ns: str
    id: int
    kind: str
    frame_id: str = ""
    position: Vec3 = (0.0, 0.0, 0.0)
    points: tuple[Vec3, ...] = ()  # line strips: the line's vertices
    scale: Vec3 = (1.0, 1.0, 1.0)  # spheres: diameters; lines: scale[0] the width; text: scale[2] the height
    rgba: RGBA = (1.0, 1.0, 1.0, 1.0)
    text: str = ""

    @property
    def key(self) -> tuple[str, int]:
        return self.ns, self.id


def spread(n: int, k: int) -> list[int]:
    """``min(n, k)`` indices into ``range(n)``, evenly spread, first and last included, ascending and distinct."""
    if n <= k:
        return list(range(n))
    if k == 1:
        return [n - 1]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def _frame_id(view: MemoryView) -> str:
    """The frame the markers are drawn in: the newest pose's (poses are kept in one frame, unless the source changed)."""
    for f in reversed(view.frames):
        for p in reversed((f.span_end_pose,) + f.poses):
            if p is not None:
                return p.frame_id
    return ""


def _at(pose: Pose | None, frame_id: str) -> Vec3 | None:
    return pose.position if pose is not None and pose.frame_id == frame_id else None


def brightness(stamp_ns: int, oldest_ns: int, newest_ns: int) -> float:
    """1 for the newest stamp held, ``OLDEST_BRIGHTNESS`` for the oldest, linear in between."""
    if newest_ns <= oldest_ns:
        return 1.0
    age = min(1.0, max(0.0, (newest_ns - stamp_ns) / (newest_ns - oldest_ns)))
    return 1.0 - (1.0 - OLDEST_BRIGHTNESS) * age


def frame_colour(frame: FrameView, oldest_ns: int, newest_ns: int) -> RGBA:
    """Its tier's colour, darkened by its age within the memory's span."""
    b = brightness(frame.stamp_ns, oldest_ns, newest_ns)
    r, g, bl = TIER_RGB[frame.tier]
    return (r * b, g * b, bl * b, 1.0)


def _path(view: MemoryView, frame_id: str, limits: MarkerSettings) -> list[MarkerSpec]:
    points = sorted({(s, p) for f in view.frames
                     for s, p in list(zip(f.stamps_ns, f.poses)) + [(f.span_end_ns, f.span_end_pose)]
                     if _at(p, frame_id) is not None}, key=lambda sp: sp[0])
    if len(points) < 2:
        return []
    xyz = tuple(points[i][1].position for i in spread(len(points), limits.max_path_points))
    width = limits.point_size_m * LINE_WIDTH_SHARE
    return [MarkerSpec(NS_PATH, 0, "line_strip", frame_id, points=xyz, scale=(width, 0.0, 0.0), rgba=PATH_RGBA)]


def _frames(view: MemoryView, frame_id: str, limits: MarkerSettings) -> list[MarkerSpec]:
    placed = [f for f in view.frames if _at(f.pose, frame_id) is not None]
    oldest, newest = view.span_ns
    d = limits.point_size_m
    out = []
    for f in (placed[i] for i in spread(len(placed), limits.max_frames)):
        at = f.pose.position
        out.append(MarkerSpec(NS_FRAMES, f.block_id, "sphere", frame_id, at, scale=(d, d, d),
                              rgba=frame_colour(f, oldest, newest)))
        if f.span_end_ns:
            end = _at(f.span_end_pose, frame_id) or at
            rise = min(STILL_RISE_MAX_M, STILL_RISE_M_PER_S * (f.span_end_ns - f.stamps_ns[-1]) / 1e9)
            out.append(MarkerSpec(NS_STILL, f.block_id, "line_strip", frame_id,
                                  points=(at, (end[0], end[1], end[2] + rise)),
                                  scale=(d * LINE_WIDTH_SHARE, 0.0, 0.0), rgba=STILL_RGBA))
    return out


def sightings(view: MemoryView, frame_id: str) -> list[tuple[FrameView, str]]:
    """(first frame, words) of each sighting: a run of one camera's consecutive frames with the same words,
    placed at the first frame of the run that has a pose in ``frame_id``; oldest first."""
    out = []
    by_camera = sorted(view.frames, key=lambda f: (f.camera, f.stamp_ns, f.block_id))
    for _, run in groupby(by_camera, key=lambda f: f.camera):
        for words, same in groupby(run, key=lambda f: f.words):
            placed = next((f for f in same if _at(f.pose, frame_id) is not None), None)
            if words and placed is not None:
                out.append((placed, ", ".join(words)))
    out.sort(key=lambda fw: (fw[0].stamp_ns, fw[0].block_id))
    return out


def _words(view: MemoryView, frame_id: str, limits: MarkerSettings) -> list[MarkerSpec]:
    h = limits.text_size_m
    out = []
    for f, text in sightings(view, frame_id)[-limits.max_labels:]:
        x, y, z = f.pose.position
        out.append(MarkerSpec(NS_WORDS, f.block_id, "text", frame_id, (x, y, z + LABEL_LIFT_M), scale=(0.0, 0.0, h),
                              rgba=WORDS_RGBA, text=text[:MAX_LABEL_CHARS]))
    return out


def memory_markers(view: MemoryView, limits: MarkerSettings) -> list[MarkerSpec]:
    """The memory drawn: path, frames, still spans and sighting labels (module docstring), in one frame.

    Bounded: at most 1 + 2 * ``max_frames`` + ``max_labels`` markers, whatever the memory holds.
    """
    frame_id = _frame_id(view)
    if not frame_id:
        return []
    return _path(view, frame_id, limits) + _frames(view, frame_id, limits) + _words(view, frame_id, limits)


@dataclass(frozen=True, slots=True)
class EvidenceMark:
    """One moment an answer rests on: its rank (0 = first), stamp, the pose it was seen from, and its score."""

    rank: int
    stamp_ns: int
    pose: Pose | None
    score: float | None = None


def evidence_markers(words: str, moments: list[EvidenceMark], limits: MarkerSettings) -> list[MarkerSpec]:
    """An answer on the map: a ``delete_all`` (the previous answer goes), then per moment with a pose a sphere
    (twice a frame's size) and a label: its rank, ``words`` (the query, or the answer's text) and its score.

    At most ``max_frames`` moments, by rank; ids are the ranks, in namespaces of their own.
    """
    out = [MarkerSpec(NS_EVIDENCE, 0, "delete_all")]
    d, h = 2 * limits.point_size_m, limits.text_size_m
    for m in sorted(moments, key=lambda m: m.rank)[:limits.max_frames]:
        if m.pose is None:
            continue
        x, y, z = m.pose.position
        score = "" if m.score is None else f" ({m.score:.2f})"
        out.append(MarkerSpec(NS_EVIDENCE, m.rank, "sphere", m.pose.frame_id, (x, y, z), scale=(d, d, d), rgba=EVIDENCE_RGBA))
        out.append(MarkerSpec(NS_EVIDENCE_TEXT, m.rank, "text", m.pose.frame_id, (x, y, z + LABEL_LIFT_M + d),
                              scale=(0.0, 0.0, h), rgba=EVIDENCE_RGBA,
                              text=f"#{m.rank + 1} {words}"[:MAX_LABEL_CHARS] + score))
    return out


class MarkerBook:
    """What was last published on one topic, to turn each new drawing into an update.

    Invariant: after ``update`` returns, ``published`` is exactly the keys of the drawing passed in; the
    returned list draws those and deletes every key published before and not drawn now (in the frame it
    was drawn in), so no stale marker stays on a viewer. Not thread-safe: one caller (the markers' timer).
    """

    def __init__(self) -> None:
        self.published: dict[tuple[str, int], str] = {}  # (ns, id) -> frame_id of what a viewer shows now

    def update(self, drawing: list[MarkerSpec]) -> list[MarkerSpec]:
        now = {m.key: m.frame_id for m in drawing}
        gone = [MarkerSpec(ns, i, "delete", frame) for (ns, i), frame in self.published.items() if (ns, i) not in now]
        self.published = now
        return gone + drawing
