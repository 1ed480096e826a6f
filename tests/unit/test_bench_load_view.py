"""bench/load_view.py's measurement of the sheet's thumbnail store at an hour of frames: the bytes it holds are the
store's own (its cap binds, the newest kept), and the arithmetic of the uncapped figure is that of one thumbnail."""

from __future__ import annotations

import pytest

pytest.importorskip("rclpy", reason="bench/load.py is a ROS client: run `make test`")

from bench.load_view import thumbnail_costs  # noqa: E402
from videokv_node.node_settings import SheetSettings  # noqa: E402


def test_an_hour_of_thumbnails_is_held_within_the_cap_and_the_sheet_is_drawn_from_the_newest():
    sheet = SheetSettings(thumbnail_bytes=1 << 20, thumbnail_width=64, max_frames=6, columns=3)
    c = thumbnail_costs(300, 640, 480, sheet)
    assert c["thumbnail"] == 64 * 48 * 3 and c["uncapped"] == 300 * 64 * 48 * 3
    assert c["kept"] == (1 << 20) // (64 * 48 * 3) and c["held"] == c["kept"] * c["thumbnail"] <= c["cap"] == 1 << 20
    assert 0 < c["sheet_bytes"] <= sheet.max_bytes and c["add_us"] > 0
    small = thumbnail_costs(10, 320, 240, sheet)  # under the cap: all of them
    assert small["kept"] == 10 and small["held"] == small["uncapped"] == 10 * 64 * 48 * 3
