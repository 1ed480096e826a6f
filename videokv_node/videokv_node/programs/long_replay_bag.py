"""Frames of a rosbag2 bag for a LongReplay goal, read with the ``rosbags`` library (no rclpy, no rosbag2_py).

Image and CompressedImage topics are filtered by header stamp (``since``/``until``,
0 = open), put in stamp order, thinned per topic to ``sample_fps`` by header stamp
as the node's sampler does, decoded to RGB (only the kept frames), and returned
sorted by stamp.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from videokv_node.ingest.image_decode import ImageDecodeError, decode_compressed_image, decode_raw_image

IMAGE = "sensor_msgs/msg/Image"
COMPRESSED = "sensor_msgs/msg/CompressedImage"
NS_PER_S = 1_000_000_000


def bag_frames(path: str, topics: list[str], since_ns: int, until_ns: int, sample_fps: float
               ) -> tuple[list[np.ndarray], list[int], list[str]]:
    """(frames RGB uint8, header stamps ns, topics) in stamp order; raises ValueError with the reason."""
    from rosbags.highlevel import AnyReader
    from rosbags.rosbag2 import ReaderError
    from rosbags.typesys import Stores, get_typestore

    if not Path(path).exists():
        raise ValueError(f"bag {path!r} does not exist on the service's machine")
    period_ns = int(NS_PER_S / sample_fps) if sample_fps > 0 else 0
    try:
        with AnyReader([Path(path)], default_typestore=get_typestore(Stores.ROS2_JAZZY)) as reader:
            conns = [c for c in reader.connections if c.msgtype in (IMAGE, COMPRESSED) and (not topics or c.topic in topics)]
            missing = set(topics) - {c.topic for c in conns}
            if missing:
                raise ValueError(f"no image topic {sorted(missing)} in the bag")
            # Pass 1, stamps only (an hour of camera frames does not fit in RAM): which messages to keep.
            # Bags are in receive order; header stamps decide, so a late-delivered frame keeps its place in time.
            found = []  # (stamp, topic, ordinal) in the window
            for ordinal, (conn, _, raw) in enumerate(reader.messages(connections=conns)):
                header = reader.deserialize(raw, conn.msgtype).header
                stamp = int(header.stamp.sec) * NS_PER_S + int(header.stamp.nanosec)
                if stamp >= since_ns and (not until_ns or stamp <= until_ns):
                    found.append((stamp, conn.topic, ordinal))
            found.sort()
            wanted: dict[int, int] = {}  # ordinal -> stamp
            last: dict[str, int] = {}
            for stamp, topic, ordinal in found:
                if period_ns and topic in last and stamp - last[topic] < period_ns:
                    continue
                last[topic] = stamp
                wanted[ordinal] = stamp
            # Pass 2: decode the kept frames only.
            kept: list[tuple[int, str, np.ndarray]] = []
            for ordinal, (conn, _, raw) in enumerate(reader.messages(connections=conns)):
                if ordinal not in wanted:
                    continue
                msg = reader.deserialize(raw, conn.msgtype)
                if conn.msgtype == IMAGE:
                    rgb = decode_raw_image(msg.encoding, msg.width, msg.height, msg.step, msg.data, bool(msg.is_bigendian))
                else:
                    rgb = decode_compressed_image(msg.format, msg.data)
                kept.append((wanted[ordinal], conn.topic, rgb))
    except (ReaderError, ImageDecodeError) as exc:
        raise ValueError(f"bag {path!r}: {exc}") from exc
    kept.sort(key=lambda x: x[0])  # stable: equal stamps keep bag order
    return [k[2] for k in kept], [k[0] for k in kept], [k[1] for k in kept]
