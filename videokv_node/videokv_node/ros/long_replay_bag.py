"""Frames of a rosbag2 bag for a LongReplay goal, read with the ``rosbags`` library (no rclpy, no rosbag2_py).

Image and CompressedImage topics are read in bag order, filtered by header stamp
(``since``/``until``, 0 = open), thinned per topic to ``sample_fps`` by header stamp
as the node's sampler does, decoded to RGB, and returned sorted by stamp.
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
    kept: list[tuple[int, str, np.ndarray]] = []
    last: dict[str, int] = {}
    try:
        with AnyReader([Path(path)], default_typestore=get_typestore(Stores.ROS2_JAZZY)) as reader:
            conns = [c for c in reader.connections if c.msgtype in (IMAGE, COMPRESSED) and (not topics or c.topic in topics)]
            missing = set(topics) - {c.topic for c in conns}
            if missing:
                raise ValueError(f"no image topic {sorted(missing)} in the bag")
            for conn, _, raw in reader.messages(connections=conns):
                msg = reader.deserialize(raw, conn.msgtype)
                stamp = int(msg.header.stamp.sec) * NS_PER_S + int(msg.header.stamp.nanosec)
                if stamp < since_ns or (until_ns and stamp > until_ns):
                    continue
                if period_ns and conn.topic in last and stamp - last[conn.topic] < period_ns:
                    continue
                last[conn.topic] = stamp
                if conn.msgtype == IMAGE:
                    rgb = decode_raw_image(msg.encoding, msg.width, msg.height, msg.step, msg.data, bool(msg.is_bigendian))
                else:
                    rgb = decode_compressed_image(msg.format, msg.data)
                kept.append((stamp, conn.topic, rgb))
    except (ReaderError, ImageDecodeError) as exc:
        raise ValueError(f"bag {path!r}: {exc}") from exc
    kept.sort(key=lambda x: x[0])
    return [k[2] for k in kept], [k[0] for k in kept], [k[1] for k in kept]
