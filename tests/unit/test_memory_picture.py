"""The README's picture of the memory (view/picture.py) and the viewer's side of its capture (programs/memory_capture.py):
what the map draws is what the markers say, labels at one place are stacked, the PNG stays small; marker messages
round-trip to the library's MarkerSpec and apply as a viewer applies them."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from videokv_node.node_settings import MarkerSettings, SheetSettings
from videokv_node.programs.memory_capture import shown
from videokv_node.view.contact_sheet import Thumbnails, render_sheet
from videokv_node.view.markers import NS_FRAMES, NS_WORDS, MarkerBook, MarkerSpec, memory_markers
from videokv_node.view.memory_view import MemoryView
from videokv_node.view.picture import map_layers, render_picture, stacked
from tests.unit.test_memory_view import frame_view

NS = 1_000_000_000


def drawing(n: int = 6) -> dict:
    view = MemoryView(tuple(frame_view(i, words=("dog",) if i in (2, 3) else ("car",) if i == 5 else ()) for i in range(n)))
    return shown([MarkerBook().update(memory_markers(view, MarkerSettings()))])


def test_the_map_draws_the_markers_positions_in_their_frame():
    layers = map_layers(drawing())
    assert layers["frame_id"] == "odom"
    assert layers["path"] == [(float(i), 2.0 * i) for i in range(6)]  # frame i seen from x = i, y = 2i
    assert sorted((x, y) for x, y, _ in layers["frames"]) == [(float(i), 2.0 * i) for i in range(6)]
    assert sorted((x, y, t) for x, y, t in layers["labels"]) == [(2.0, 4.0, "dog"), (5.0, 10.0, "car")]
    assert layers["still"] == []


def test_labels_at_one_place_are_stacked_and_others_stand_alone():
    got = stacked([(20.0, 0.0, "a"), (20.1, 0.0, "b"), (21.0, 0.0, "c"), (20.0, 0.05, "d")])
    assert got == [(20.0, 0.0, "a", 0), (20.0, 0.0, "b", 1), (21.0, 0.0, "c", 0), (20.0, 0.0, "d", 2)]


def test_the_picture_is_a_small_png_of_the_map_beside_the_sheet():
    thumbs = Thumbnails(1 << 20, 32)
    view = MemoryView(tuple(frame_view(i) for i in range(6)))
    for f in view.frames:
        thumbs.add(f.camera, f.stamp_ns, np.full((48, 64, 3), 40 * f.block_id, np.uint8))
    sheet = render_sheet(view, thumbs, SheetSettings(thumbnail_width=32, columns=3, max_frames=6))
    png = render_picture(drawing(), sheet.jpeg, "title", "notes")
    image = Image.open(io.BytesIO(png))
    assert image.format == "PNG" and image.width == 1300 and len(png) < 300 << 10
    only_map = Image.open(io.BytesIO(render_picture(drawing(), None)))
    assert only_map.width == 700


def test_a_viewer_applies_adds_deletes_and_delete_all_in_order():
    a, b = MarkerSpec(NS_FRAMES, 1, "sphere", "odom"), MarkerSpec(NS_WORDS, 1, "text", "odom", text="dog")
    assert shown([[a, b], [MarkerSpec(NS_FRAMES, 1, "delete", "odom")]]) == {b.key: b}
    assert shown([[a], [MarkerSpec("x", 0, "delete_all")], [b]]) == {b.key: b}


def test_marker_messages_round_trip_to_the_specs_they_were_made_from():
    pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")
    pytest.importorskip("visualization_msgs", reason="visualization_msgs is not installed: run `make build`")
    from videokv_node.programs.memory_capture import from_marker
    from videokv_node.ros.memory_view import to_marker

    specs = MarkerBook().update(memory_markers(MemoryView(tuple(frame_view(i, words=("dog",)) for i in range(3))),
                                               MarkerSettings()))
    specs.append(MarkerSpec(NS_FRAMES, 7, "delete", "odom"))
    for spec in specs:
        back = from_marker(to_marker(spec))
        assert (back.ns, back.id, back.kind, back.frame_id, back.text) == (spec.ns, spec.id, spec.kind, spec.frame_id, spec.text)
        if spec.kind != "delete":
            assert back.position == pytest.approx(spec.position) and back.rgba == pytest.approx(spec.rgba, abs=1e-6)
            assert [p for q in back.points for p in q] == pytest.approx([p for q in spec.points for p in q])
