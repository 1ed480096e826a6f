"""rosbag2 in and out (mcap and sqlite3, raw and compressed): order, stamps, decoding, bad bags."""

from __future__ import annotations

import numpy as np
import pytest

from videokv_node.eval.bag_io import COMPRESSED, TYPESTORE, BagError, ImageBag, image_message, write_image_bag, write_messages

NS = 1_000_000_000


def frames(n, h=6, w=8, seed=0):
    rng = np.random.default_rng(seed)
    return [((i + 1) * NS // 2, rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for i in range(n)]


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
@pytest.mark.parametrize("compressed", ["", "png"])
def test_round_trip_keeps_order_stamps_and_pixels(tmp_path, storage, compressed):
    src = frames(5)
    assert write_image_bag(tmp_path / "b", src, "/cam", storage, compressed) == 5
    with ImageBag(tmp_path / "b") as bag:
        assert bag.name == "b" and bag.topics == ["/cam"] and bag.message_count() == 5
        assert bag.start_ns == src[0][0] and bag.end_ns == src[-1][0] + 1  # rosbags: one past the last
        got = list(bag.images())
    assert [g.bag_time_ns for g in got] == [s for s, _ in src] == [g.stamp_ns for g in got]
    assert all(g.compressed == bool(compressed) for g in got)
    for g, (_, rgb) in zip(got, src):
        np.testing.assert_array_equal(g.rgb(), rgb)  # png and rgb8 are lossless


def test_two_topics_interleave_in_bag_time_and_can_be_chosen(tmp_path):
    rgb = np.zeros((4, 4, 3), np.uint8)
    msgs = [("/a", 3 * NS, image_message(rgb, 3 * NS)), ("/b/compressed", 1 * NS, image_message(rgb, 1 * NS, compressed="jpeg")),
            ("/a", 2 * NS, image_message(rgb, 2 * NS))]
    write_messages(tmp_path / "b", msgs)
    with ImageBag(tmp_path / "b") as bag:
        assert bag.available == {"/a": "sensor_msgs/msg/Image", "/b/compressed": COMPRESSED}
        assert [(i.topic, i.bag_time_ns) for i in bag.images()] == [("/b/compressed", NS), ("/a", 2 * NS), ("/a", 3 * NS)]
    with ImageBag(tmp_path / "b", ["/a"]) as bag:
        assert [i.bag_time_ns for i in bag.images()] == [2 * NS, 3 * NS]


def test_missing_topic_names_what_the_bag_has(tmp_path):
    write_image_bag(tmp_path / "b", frames(2), "/cam")
    with pytest.raises(BagError, match=r"no image topic /nope in the bag; its image topics: /cam \(Image\)"):
        ImageBag(tmp_path / "b", ["/nope"])


def test_bag_without_images(tmp_path):
    msg = TYPESTORE.types["std_msgs/msg/String"](data="hi")
    write_messages(tmp_path / "b", [("/chatter", NS, msg)])
    with pytest.raises(BagError, match="no sensor_msgs/Image or CompressedImage topic"):
        ImageBag(tmp_path / "b")


def test_missing_and_corrupt_bags_are_bag_errors(tmp_path):
    with pytest.raises(BagError, match="no such bag"):
        ImageBag(tmp_path / "nothing")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "metadata.yaml").write_text("rosbag2_bagfile_information: [not, a, bag")
    with pytest.raises(BagError, match="cannot open as a rosbag2"):
        ImageBag(tmp_path / "junk")


def test_truncated_mcap_fails_part_way_after_the_readable_messages(tmp_path):
    write_image_bag(tmp_path / "b", frames(40, 32, 32), "/cam")
    (data,) = (tmp_path / "b").glob("*.mcap")
    raw = data.read_bytes()
    data.write_bytes(raw[: len(raw) // 2])
    seen = []
    with pytest.raises(BagError):  # at open (no summary) or part-way: either way named, never a crash
        with ImageBag(tmp_path / "b") as bag:
            for image in bag.images():
                seen.append(image.bag_time_ns)
    assert seen == sorted(seen)


def test_restamped_unstamped_frame(tmp_path):
    rgb = np.full((2, 2, 3), 7, np.uint8)
    msgs = [("/cam", 5 * NS, image_message(rgb, 0))]
    write_messages(tmp_path / "b", msgs)
    with ImageBag(tmp_path / "b") as bag:
        (image,) = bag.images()
    assert image.stamp_ns == 0 and image.bag_time_ns == 5 * NS
    again = TYPESTORE.deserialize_cdr(image.restamped(5 * NS), "sensor_msgs/msg/Image")
    assert (again.header.stamp.sec, again.header.stamp.nanosec) == (5, 0)
    np.testing.assert_array_equal(again.data, image.msg.data)


def test_a_failed_write_leaves_no_bag(tmp_path):
    def broken():
        yield from frames(2)
        raise ValueError("camera unplugged")

    with pytest.raises(ValueError, match="unplugged"):
        write_image_bag(tmp_path / "b", broken(), "/cam")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FileExistsError):
        write_image_bag(tmp_path, frames(1), "/cam")
