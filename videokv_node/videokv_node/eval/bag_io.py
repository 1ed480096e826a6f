"""Camera images in and out of rosbag2 files (mcap or sqlite3), without ROS 2 installed.

The ``rosbags`` library reads and writes rosbag2 in pure Python, so a bag recorded
on a robot can be evaluated on any machine. Images come out in bag (recording)
time order with their header stamps and their CDR bytes exactly as recorded (the
``--via ros`` replay republishes those bytes unchanged, as ``ros2 bag play`` does);
``BagImage.rgb`` decodes them with the node's own decoders, so a frame is the same
array here as in the node.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rosbags.rosbag2 import Reader, StoragePlugin, Writer
from rosbags.rosbag2.metadata import Qos
from rosbags.typesys import Stores, get_typestore

from videokv_node.ingest.image_decode import (
    decode_compressed_image,
    decode_raw_image,
    encode_compressed_image,
    encode_raw_image,
)
from videokv_node.ingest.sampler import NS_PER_S

IMAGE = "sensor_msgs/msg/Image"
COMPRESSED = "sensor_msgs/msg/CompressedImage"
IMAGE_TYPES = (IMAGE, COMPRESSED)
# What a replay passes on to the node besides images, as ``ros2 bag play`` would: poses (pose_topic),
# tf (pose_source tf) and camera_info. Never /clock: the replay publishes its own from the bag time.
RELAY_TYPES = ("nav_msgs/msg/Odometry", "geometry_msgs/msg/PoseStamped", "geometry_msgs/msg/PoseWithCovarianceStamped",
               "tf2_msgs/msg/TFMessage", "sensor_msgs/msg/CameraInfo")
STORAGES = {"mcap": StoragePlugin.MCAP, "sqlite3": StoragePlugin.SQLITE3}
TYPESTORE = get_typestore(Stores.ROS2_JAZZY)


class BagError(RuntimeError):
    """A bag that cannot be replayed (unreadable, corrupt, no such topic); the message says which and why."""


@dataclass(frozen=True, slots=True)
class BagImage:
    """One recorded image message."""

    topic: str  # the topic it was recorded on (the camera's name in memory)
    bag_time_ns: int  # when it was recorded: replay order and the question clock
    stamp_ns: int  # its header stamp; 0 when the driver left it unset
    compressed: bool  # sensor_msgs/CompressedImage rather than Image
    raw: bytes  # the serialized (CDR) message as recorded
    msg: object  # the deserialized message (rosbags' dataclass)

    def rgb(self) -> np.ndarray:
        """(H, W, 3) uint8 RGB, decoded as the node does; raises ImageDecodeError with a reason."""
        m = self.msg
        if self.compressed:
            return decode_compressed_image(m.format, m.data)
        return decode_raw_image(m.encoding, m.width, m.height, m.step, m.data, bool(m.is_bigendian))

    def restamped(self, stamp_ns: int) -> bytes:
        """The CDR bytes with the header stamp replaced (unstamped frames get their bag time)."""
        m = self.msg
        m.header.stamp.sec, m.header.stamp.nanosec = divmod(stamp_ns, NS_PER_S)
        return bytes(TYPESTORE.serialize_cdr(m, COMPRESSED if self.compressed else IMAGE))


@dataclass(frozen=True, slots=True)
class BagMessage:
    """One recorded message of a relayed topic (RELAY_TYPES), passed on unchanged."""

    topic: str
    msgtype: str  # "nav_msgs/msg/Odometry"
    bag_time_ns: int
    raw: bytes  # the serialized (CDR) message as recorded


class ImageBag:
    """A rosbag2 opened for its image topics; use as a context manager.

    ``start_ns``/``end_ns`` are the whole bag's recording span (its metadata): the
    stream's origin for question times and its end. ``images()`` yields the chosen
    topics' messages in bag time order; a read error part-way raises BagError after
    the messages read so far were yielded. ``messages()`` yields the same images and, in
    bag time order among them, the messages of ``relay`` (every topic of the bag whose
    type is in RELAY_TYPES, by default: odometry, tf, camera_info) as BagMessage.
    """

    def __init__(self, path: str | Path, topics: Iterable[str] | None = None, relay: Iterable[str] | None = None) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise BagError(f"{self.path}: no such bag")
        try:
            self._reader = Reader(self.path)
            self._reader.open()
        except Exception as exc:  # noqa: BLE001 - rosbags raises many types on corrupt files
            raise BagError(f"{self.path}: cannot open as a rosbag2: {exc}") from exc
        found = {c.topic: c.msgtype for c in self._reader.connections if c.msgtype in IMAGE_TYPES}
        self.available = dict(sorted(found.items()))  # every image topic of the bag
        if topics:
            wanted = list(dict.fromkeys(topics))
            missing = [t for t in wanted if t not in found]
            if missing:
                self.close()
                have = ", ".join(f"{t} ({m.rsplit('/', 1)[-1]})" for t, m in self.available.items()) or "none"
                raise BagError(f"{self.path}: no image topic {', '.join(missing)} in the bag; its image topics: {have}")
        elif not found:
            self.close()
            raise BagError(f"{self.path}: no sensor_msgs/Image or CompressedImage topic in the bag")
        else:
            wanted = list(self.available)
        self.topics = wanted
        self._connections = [c for c in self._reader.connections if c.topic in wanted]
        relayable = {c.topic: c.msgtype for c in self._reader.connections if c.msgtype in RELAY_TYPES}
        self.relay = {t: relayable[t] for t in (sorted(relayable) if relay is None else relay) if t in relayable}
        self._relayed = [c for c in self._reader.connections if c.topic in self.relay]
        self.start_ns = int(self._reader.start_time)
        self.end_ns = int(self._reader.end_time)

    @property
    def name(self) -> str:
        """The bag's name, matched against the question file's video_id."""
        return self.path.stem if self.path.is_file() else self.path.name

    def message_count(self, relayed: bool = False) -> int:
        """The chosen image topics' messages (and the relayed topics', if ``relayed``)."""
        return sum(c.msgcount for c in self._connections + (self._relayed if relayed else []))

    def images(self) -> Iterator[BagImage]:
        yield from self._read(self._connections)  # type: ignore[misc]: only image connections, so only BagImages

    def messages(self) -> Iterator[BagImage | BagMessage]:
        """The images and the relayed topics' messages, in bag time order."""
        yield from self._read(self._connections + self._relayed)

    def _read(self, connections) -> Iterator[BagImage | BagMessage]:
        try:
            for conn, t_ns, raw in self._reader.messages(connections=connections):
                if conn.msgtype not in IMAGE_TYPES:
                    yield BagMessage(conn.topic, conn.msgtype, int(t_ns), bytes(raw))
                    continue
                msg = TYPESTORE.deserialize_cdr(raw, conn.msgtype)
                stamp = msg.header.stamp
                yield BagImage(conn.topic, int(t_ns), int(stamp.sec) * NS_PER_S + int(stamp.nanosec),
                               conn.msgtype == COMPRESSED, bytes(raw), msg)
        except Exception as exc:  # noqa: BLE001 - a truncated or corrupt chunk surfaces here
            raise BagError(f"{self.path}: unreadable part-way: {exc}") from exc

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> ImageBag:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def image_message(rgb: np.ndarray, stamp_ns: int, frame_id: str = "camera", compressed: str = "",
                  encoding: str = "rgb8"):
    """A rosbags Image (or CompressedImage, ``compressed`` = "jpeg"/"png") message of an RGB frame."""
    types = TYPESTORE.types
    sec, nanosec = divmod(int(stamp_ns), NS_PER_S)
    header = types["std_msgs/msg/Header"](stamp=types["builtin_interfaces/msg/Time"](sec=sec, nanosec=nanosec),
                                          frame_id=frame_id)
    if compressed:
        fmt, data = encode_compressed_image(rgb, compressed)
        return types[COMPRESSED](header=header, format=fmt, data=np.frombuffer(data, np.uint8))
    f = encode_raw_image(rgb, encoding)
    return types[IMAGE](header=header, height=f["height"], width=f["width"], encoding=f["encoding"],
                        is_bigendian=int(f["is_bigendian"]), step=f["step"], data=np.frombuffer(f["data"], np.uint8))


def write_messages(path: str | Path, messages: Iterable[tuple[str, int, object]], storage: str = "mcap",
                   qos: Mapping[str, Sequence[Qos]] | None = None) -> int:
    """Write (topic, bag_time_ns, rosbags message) as a new rosbag2 directory, in the order given; returns the count.

    ``qos``: a topic's offered QoS profiles, recorded in the bag's metadata as ``ros2 bag record``
    does; ``ros2 bag play`` publishes with them (/tf_static must be transient local, or a node
    started after its one message never sees it). Other topics get rosbag2's defaults.
    """
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {sorted(STORAGES)}, got {storage!r}")
    path = Path(path)
    if path.exists():
        raise FileExistsError(f"{path} exists; a bag is written to a new directory")
    partial = path.with_name(f".{path.name}.partial")  # renamed into place when complete: never half a bag
    shutil.rmtree(partial, ignore_errors=True)
    count, conns = 0, {}
    try:
        with Writer(partial, version=9, storage_plugin=STORAGES[storage]) as writer:
            for topic, t_ns, msg in messages:
                msgtype = msg.__msgtype__
                if topic not in conns:
                    conns[topic] = writer.add_connection(topic, msgtype, typestore=TYPESTORE,
                                                         offered_qos_profiles=(qos or {}).get(topic, ()))
                writer.write(conns[topic], int(t_ns), TYPESTORE.serialize_cdr(msg, msgtype))
                count += 1
        _rename_bag(partial, path)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return count


def _rename_bag(partial: Path, path: Path) -> None:
    """Move a finished bag into place; its storage files are named after the directory, so rename them and
    their entry in metadata.yaml too."""
    for f in partial.iterdir():
        if f.name.startswith(partial.name):
            f.rename(partial / (path.name + f.name[len(partial.name):]))
    meta = partial / "metadata.yaml"
    meta.write_text(meta.read_text().replace(partial.name, path.name))
    partial.rename(path)


def write_image_bag(path: str | Path, frames: Iterable[tuple[int, np.ndarray]], topic: str = "/camera/image_raw",
                    storage: str = "mcap", compressed: str = "", encoding: str = "rgb8") -> int:
    """Write (stamp_ns, rgb) frames of one camera as a new rosbag2 directory; header stamp = bag time.

    ``compressed`` ("jpeg" or "png") writes sensor_msgs/CompressedImage instead of Image.
    """
    messages = ((topic, s, image_message(rgb, s, compressed=compressed, encoding=encoding)) for s, rgb in frames)
    return write_messages(path, messages, storage)
