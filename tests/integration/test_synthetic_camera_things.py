"""The demo camera's real things (``synthetic_camera.things_stream``): each thing's pan in order, stamped 1/fps apart.

Needs opencv-doc's photographs (``scripts/setup_footage.sh``; ``make demo`` runs it); skipped, with the
reason, where they are not unpacked. No DDS: the publisher's frames are checked before they are sent.
"""

from __future__ import annotations

import numpy as np
import pytest

from videokv_node.eval.footage import opencv_data_dir
from videokv_node.programs.demo import DEMO_THINGS
from videokv_node.programs.synthetic_camera import things_stream
from videokv_node.tinyvlm.things_heldout import HELD_OUT_THINGS, PAN_FRAMES, thing_frames

pytestmark = pytest.mark.skipif(opencv_data_dir() is None, reason="opencv-doc's photographs not unpacked (scripts/setup_footage.sh)")


def test_each_thing_is_panned_in_order_with_stamps_one_period_apart():
    stream = things_stream(list(DEMO_THINGS), fps=4.0, start_ns=10**9)
    assert len(stream) == PAN_FRAMES * len(DEMO_THINGS)
    assert [t for t, _ in stream] == [10**9 + i * 250_000_000 for i in range(len(stream))]
    by_source = {i.source: i for i in HELD_OUT_THINGS}
    for k, source in enumerate(DEMO_THINGS):
        expected = thing_frames(by_source[source])
        got = [rgb for _, rgb in stream[k * PAN_FRAMES : (k + 1) * PAN_FRAMES]]
        assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))


def test_an_unknown_thing_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="unknown things"):
        things_stream(["opencv:nothing.jpg"], fps=4.0, start_ns=0)
