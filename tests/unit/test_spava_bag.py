"""LongReplay bag goals: frames read from a rosbag2 bag with ``rosbags``, filtered, thinned and decoded."""

from __future__ import annotations

import numpy as np
import pytest

rosbags = pytest.importorskip("rosbags", reason="rosbags is in requirements/base.txt: run scripts/setup_env.sh")

from rosbags.rosbag2 import Writer  # noqa: E402
from rosbags.typesys import Stores, get_typestore  # noqa: E402

from videokv_node.ingest.image_decode import encode_compressed_image, encode_raw_image  # noqa: E402
from videokv_node.programs.long_replay_bag import bag_frames  # noqa: E402

NS = 1_000_000_000


def _rgb(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (8, 10, 3), dtype=np.uint8)


def write_bag(path) -> str:
    """cam: raw rgb8 at 1 Hz (stamps 10..15 s); cam/compressed: PNG at 10.5, 12.5 s; /cam written newest first."""
    ts = get_typestore(Stores.ROS2_JAZZY)
    Image, Compressed = ts.types["sensor_msgs/msg/Image"], ts.types["sensor_msgs/msg/CompressedImage"]
    Header, Time = ts.types["std_msgs/msg/Header"], ts.types["builtin_interfaces/msg/Time"]
    with Writer(path, version=9) as w:
        raw = w.add_connection("/cam", Image.__msgtype__, typestore=ts)
        comp = w.add_connection("/cam/compressed", Compressed.__msgtype__, typestore=ts)
        for i, t in enumerate([10, 11, 12, 13, 14, 15]):
            f = encode_raw_image(_rgb(i), "rgb8")
            msg = Image(header=Header(stamp=Time(sec=t, nanosec=0), frame_id="cam"), height=f["height"], width=f["width"],
                        encoding=f["encoding"], is_bigendian=0, step=f["step"], data=np.frombuffer(f["data"], np.uint8))
            w.write(raw, (20 - t) * NS, ts.serialize_cdr(msg, Image.__msgtype__))  # receive time reversed
        for i, t in enumerate([10, 12]):
            fmt, data = encode_compressed_image(_rgb(100 + i), "png")
            msg = Compressed(header=Header(stamp=Time(sec=t, nanosec=NS // 2), frame_id="cam"), format=fmt,
                             data=np.frombuffer(data, np.uint8))
            w.write(comp, t * NS, ts.serialize_cdr(msg, Compressed.__msgtype__))
    return str(path)


@pytest.fixture(scope="module")
def bag(tmp_path_factory):
    return write_bag(tmp_path_factory.mktemp("bag") / "replay")


def test_every_image_topic_in_stamp_order(bag):
    frames, stamps, topics = bag_frames(bag, [], 0, 0, 0.0)
    assert stamps == sorted(stamps) and len(frames) == 8
    assert topics[:2] == ["/cam", "/cam/compressed"] and stamps[:2] == [10 * NS, 10 * NS + NS // 2]
    np.testing.assert_array_equal(frames[0], _rgb(0))
    np.testing.assert_array_equal(frames[1], _rgb(100))  # PNG: lossless


def test_topic_window_and_rate_filters(bag):
    _, stamps, topics = bag_frames(bag, ["/cam"], 11 * NS, 14 * NS, 0.0)
    assert stamps == [11 * NS, 12 * NS, 13 * NS, 14 * NS] and set(topics) == {"/cam"}
    # 0.5 fps by header stamp, even though the bag stores /cam newest first
    _, stamps, _ = bag_frames(bag, ["/cam"], 0, 0, 0.5)
    assert stamps == [10 * NS, 12 * NS, 14 * NS]


def test_bad_bag_goals_fail_with_a_reason(bag, tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        bag_frames(str(tmp_path / "nothing"), [], 0, 0, 0.0)
    with pytest.raises(ValueError, match="no image topic"):
        bag_frames(bag, ["/lidar"], 0, 0, 0.0)
