"""The memory drawn (issue 46), without ROS: marker content (ids stable, counts bounded, colours by tier and age,
labels at the sightings' poses, deletions), the contact sheet (thumbnails within their cap, the sheet within its
cap, newest first), and the markers' and sheet's parameters refused with a reason."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image

from videokv_node.config_base import ConfigError
from videokv_node.node_settings import MarkerSettings, SheetSettings
from videokv_node.pose import Pose
from videokv_node.view.contact_sheet import Thumbnails, caption, render_sheet, thumbnail
from videokv_node.view.markers import (NS_EVIDENCE, NS_EVIDENCE_TEXT, NS_FRAMES, NS_PATH, NS_STILL, NS_WORDS,
                                       EvidenceMark, MarkerBook, evidence_markers, memory_markers, spread)
from videokv_node.view.memory_view import OFFLOADED, RESIDENT, FrameView, MemoryView

NS = 1_000_000_000


def pose(x: float, frame: str = "odom") -> Pose:
    return Pose.make(frame, (x, 2.0 * x, 0.0), (0.0, 0.0, 0.0, 1.0))


def frame_view(i: int, tier=RESIDENT, words=(), span_s=0.0, camera="/cam", frame="odom") -> FrameView:
    """Block i: seen at stamp i s from x = i m."""
    s = i * NS
    end = s + round(span_s * NS) if span_s else 0
    return FrameView(i, camera, (s,), (pose(float(i), frame),), tier, tuple(words), end,
                     pose(float(i), frame) if span_s else None, 3 if span_s else 0)


def by_ns(markers, ns):
    return {m.id: m for m in markers if m.ns == ns}


def test_spread_keeps_the_ends_and_bounds_the_count():
    assert spread(5, 10) == [0, 1, 2, 3, 4]
    assert spread(101, 5) == [0, 25, 50, 75, 100]
    assert spread(7, 1) == [6]
    for n, k in ((1000, 7), (10, 9), (3, 2)):
        got = spread(n, k)
        assert len(got) == k and got[0] == 0 and got[-1] == n - 1 and got == sorted(set(got))


def test_each_frame_is_a_sphere_at_its_pose_with_its_block_id_coloured_by_tier_and_age():
    view = MemoryView((frame_view(0, OFFLOADED), frame_view(5, RESIDENT), frame_view(10, RESIDENT)))
    markers = memory_markers(view, MarkerSettings())
    frames = by_ns(markers, NS_FRAMES)
    assert sorted(frames) == [0, 5, 10]
    assert {m.frame_id for m in markers} == {"odom"}
    assert frames[5].position == (5.0, 10.0, 0.0) and frames[5].kind == "sphere"
    # newest: the resident colour at full brightness; oldest (offloaded): its colour at 40 %; middle: 70 %
    assert frames[10].rgba == pytest.approx((0.10, 0.80, 0.25, 1.0))
    assert frames[0].rgba == pytest.approx((0.4 * 1.0, 0.4 * 0.55, 0.4 * 0.10, 1.0))
    assert frames[5].rgba == pytest.approx((0.7 * 0.10, 0.7 * 0.80, 0.7 * 0.25, 1.0))
    path = by_ns(markers, NS_PATH)[0]
    assert path.kind == "line_strip" and path.points == ((0.0, 0.0, 0.0), (5.0, 10.0, 0.0), (10.0, 20.0, 0.0))


def test_ids_stay_with_their_blocks_and_a_frame_that_leaves_memory_is_deleted():
    book = MarkerBook()
    s = MarkerSettings()
    first = book.update(memory_markers(MemoryView(tuple(frame_view(i) for i in range(4))), s))
    assert not [m for m in first if m.kind == "delete"]
    second = book.update(memory_markers(MemoryView(tuple(frame_view(i) for i in range(2, 6))), s))
    deleted = {(m.ns, m.id) for m in second if m.kind == "delete"}
    assert deleted == {(NS_FRAMES, 0), (NS_FRAMES, 1)}
    assert sorted(by_ns([m for m in second if m.kind != "delete"], NS_FRAMES)) == [2, 3, 4, 5]
    assert all(m.frame_id == "odom" for m in second)
    assert book.update([]) and set(book.published) == set()


def test_counts_are_bounded_whatever_the_memory_holds():
    s = MarkerSettings(max_frames=10, max_labels=4, max_path_points=20)
    view = MemoryView(tuple(frame_view(i, words=(f"thing{i // 3}",), span_s=0.5 if i % 2 else 0.0) for i in range(500)))
    markers = memory_markers(view, s)
    frames, still, words = by_ns(markers, NS_FRAMES), by_ns(markers, NS_STILL), by_ns(markers, NS_WORDS)
    assert len(frames) == 10 and 0 in frames and 499 in frames
    assert len(still) <= 10 and set(still) <= set(frames)
    assert len(words) == 4 and [w.text for w in sorted(words.values(), key=lambda m: m.id)] == [
        "thing163", "thing164", "thing165", "thing166"]  # the newest sightings
    assert len(by_ns(markers, NS_PATH)[0].points) == 20
    assert len(markers) <= 1 + 2 * s.max_frames + s.max_labels


def test_a_sighting_is_a_run_of_the_same_words_labelled_at_its_first_pose():
    view = MemoryView((frame_view(0), frame_view(1, words=("dog",)), frame_view(2, words=("dog",)),
                       frame_view(3, words=("car", "man")), frame_view(4, words=("dog",)),
                       frame_view(5, words=("dog",), camera="/other")))
    words = by_ns(memory_markers(view, MarkerSettings(text_size_m=0.4)), NS_WORDS)
    assert {i: m.text for i, m in words.items()} == {1: "dog", 3: "car, man", 4: "dog", 5: "dog"}
    assert words[1].position == (1.0, 2.0, 0.5) and words[1].kind == "text" and words[1].scale[2] == 0.4


def test_a_still_span_is_one_segment_rising_with_its_length():
    view = MemoryView((frame_view(0), frame_view(1, span_s=20.0)))
    still = by_ns(memory_markers(view, MarkerSettings()), NS_STILL)
    assert list(still) == [1]
    (a, b) = still[1].points
    assert a == (1.0, 2.0, 0.0) and b == pytest.approx((1.0, 2.0, 0.4))  # 2 cm a second still


def test_frames_without_a_pose_or_in_another_frame_are_not_drawn():
    no_pose = FrameView(7, "/cam", (7 * NS,), (None,), RESIDENT, ("cup",))
    view = MemoryView((frame_view(0, frame="map"), frame_view(1), no_pose))
    markers = memory_markers(view, MarkerSettings())
    assert sorted(by_ns(markers, NS_FRAMES)) == [1]  # the newest pose is in odom
    assert not by_ns(markers, NS_WORDS) and not by_ns(markers, NS_PATH)
    assert memory_markers(MemoryView((no_pose,)), MarkerSettings()) == []


def test_an_answer_clears_the_last_one_and_marks_its_moments_by_rank():
    moments = [EvidenceMark(1, 2 * NS, pose(2.0), 0.25), EvidenceMark(0, 5 * NS, pose(5.0), 0.75),
               EvidenceMark(2, 6 * NS, None, 0.1)]
    markers = evidence_markers("the dog", moments, MarkerSettings(max_frames=5))
    assert markers[0].kind == "delete_all"
    spheres, texts = by_ns(markers[1:], NS_EVIDENCE), by_ns(markers, NS_EVIDENCE_TEXT)
    assert sorted(spheres) == [0, 1] and spheres[0].position == (5.0, 10.0, 0.0) and spheres[0].frame_id == "odom"
    assert texts[0].text == "#1 the dog (0.75)" and texts[1].text == "#2 the dog (0.25)"
    assert len(evidence_markers("x", moments, MarkerSettings(max_frames=1))) == 3  # delete_all + one moment


def test_thumbnails_stay_within_their_cap_oldest_dropped_first():
    rgb = np.zeros((120, 160, 3), np.uint8)
    assert thumbnail(rgb, 80).shape == (60, 80, 3) and thumbnail(rgb[:10, :20], 80).shape == (10, 20, 3)
    one = 60 * 80 * 3
    thumbs = Thumbnails(3 * one + 10, 80)
    for i in range(5):
        thumbs.add("/cam", i * NS, rgb + i)
        assert thumbs.bytes <= thumbs.capacity_bytes
    assert len(thumbs) == 3 and thumbs.get("/cam", NS) is None and int(thumbs.get("/cam", 4 * NS)[0, 0, 0]) == 4
    thumbs.prune(MemoryView((frame_view(3),)))  # 4 s is newer than the memory holds: still on its way, kept
    assert thumbs.get("/cam", 2 * NS) is None and thumbs.get("/cam", 3 * NS) is not None and len(thumbs) == 2
    Thumbnails(10, 80).add("/cam", 0, rgb)  # larger than the whole cap: not kept, no error


def test_the_sheet_shows_the_newest_frames_first_within_its_byte_cap():
    rng = np.random.default_rng(0)
    s = SheetSettings(thumbnail_width=64, max_frames=6, columns=3, max_bytes=16 << 10, quality=95)
    thumbs = Thumbnails(s.thumbnail_bytes, s.thumbnail_width)
    view = MemoryView(tuple(frame_view(i, words=("dog",)) for i in range(10)))
    for i in range(10):
        thumbs.add("/cam", i * NS, rng.integers(0, 256, (48, 64, 3), dtype=np.uint8))  # noise: JPEG's worst case
    sheet = render_sheet(view, thumbs, s)
    assert sheet is not None and len(sheet.jpeg) <= s.max_bytes and 1 <= sheet.frames <= 6
    image = Image.open(io.BytesIO(sheet.jpeg))
    assert image.format == "JPEG" and image.width == min(s.columns, sheet.frames) * (64 + 4)
    roomy = render_sheet(view, thumbs, SheetSettings(thumbnail_width=64, max_frames=6, columns=3, max_bytes=1 << 20))
    assert roomy.frames == 6 and roomy.quality == 80  # room enough: every frame at the set quality
    assert render_sheet(view, Thumbnails(1 << 20, 64), s) is None  # no thumbnail of a frame in memory
    assert caption(frame_view(3, words=("dog", "car"), span_s=2.0), 9 * NS) == ("-6.0 s 00:00:03", "still 2.0 s", "dog, car")
    assert caption(frame_view(3, tier=OFFLOADED), 3 * NS)[1] == "host"


@pytest.mark.parametrize("cls, kwargs, reason", [
    (MarkerSettings, {"rate_hz": 0.0}, "markers.rate_hz"),
    (MarkerSettings, {"rate_hz": 50.0}, "markers.rate_hz"),
    (MarkerSettings, {"max_path_points": 1}, "max_path_points"),
    (MarkerSettings, {"point_size_m": math.inf}, "point_size_m"),
    (SheetSettings, {"thumbnail_width": 8}, "sheet.thumbnail_width"),
    (SheetSettings, {"thumbnail_bytes": 100}, "sheet.thumbnail_bytes"),
    (SheetSettings, {"columns": 30}, "sheet.columns"),
    (SheetSettings, {"max_bytes": 1000}, "sheet.max_bytes"),
    (SheetSettings, {"quality": 0}, "sheet.quality"),
])
def test_bad_values_are_refused_with_the_parameter_named(cls, kwargs, reason):
    with pytest.raises(ConfigError, match=reason.replace(".", r"\.")):
        cls(**kwargs)


def test_the_viewer_configurations_show_the_nodes_topics_with_matching_qos():
    """config/videokv.rviz and config/videokv.foxglove.json parse and name the topics the node publishes."""
    import json
    from pathlib import Path

    import yaml

    config = Path(__file__).resolve().parents[2] / "config"
    rviz = yaml.safe_load((config / "videokv.rviz").read_text())
    displays = {d["Name"]: d for d in rviz["Visualization Manager"]["Displays"]}
    topics = {d["Topic"]["Value"]: d["Topic"] for d in displays.values() if "Topic" in d}
    for latched in ("/videokv/memory_markers", "/videokv/answer_markers", "/videokv/memory_sheet"):
        assert topics[latched]["Durability Policy"] == "Transient Local" and topics[latched]["Reliability Policy"] == "Reliable"
    assert "/camera/image_raw" in topics and rviz["Visualization Manager"]["Global Options"]["Fixed Frame"] == "odom"
    layout = json.loads((config / "videokv.foxglove.json").read_text())
    text = json.dumps(layout["configById"])
    for topic in ("/videokv/memory_markers", "/videokv/answer_markers", "/videokv/memory_sheet", "/camera/image_raw",
                  "/videokv/memory_stats.frames_in_memory"):
        assert topic in text
