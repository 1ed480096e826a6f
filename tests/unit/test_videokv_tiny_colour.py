"""videokv-tiny v4's colour statistics and the free shapes' column words (issue 14), against
hand-computed references: a projector reading each cell's colour beside the encoder's pooled maps,
and stage 1 naming a free shape in the columns it fills."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from videokv_node.models.efficientnet_lite import FEATURE_DIM, MID_FEATURE_DIM
from videokv_node.models.pooling import COLOUR_STATS, colour_statistics
from videokv_node.models.videokv_tiny import Projector
from videokv_node.tinyvlm.scenes import SIZE, Scene, Shape, area_in_columns, cell_words, column_holder


def test_colour_statistics_of_a_cell_are_its_saturated_pixels_colour():
    """One cell of a grey image with a red patch: the chroma-weighted mean is the red (grey pixels weigh
    nothing); its mean chroma is the patch's share times red's chroma. Other cells: grey, chroma 0."""
    img = torch.full((1, 3, 4, 6), 0.5, dtype=torch.float64)
    img[0, :, 0, 0] = torch.tensor([0.9, 0.1, 0.1], dtype=torch.float64)  # one of cell (0, 0)'s 4 pixels
    stats = colour_statistics(img, (2, 3))
    assert stats.shape == (1, COLOUR_STATS, 2, 3)
    torch.testing.assert_close(stats[0, :3, 0, 0], torch.tensor([0.9, 0.1, 0.1], dtype=torch.float64), atol=1e-3, rtol=0)
    assert stats[0, 3, 0, 0].item() == pytest.approx(0.8 / 4)
    assert torch.all(stats[0, 3].flatten()[1:] == 0)
    # a cell with no colour at all: its weighted mean is 0 (nothing coloured), not a division by zero
    assert torch.all(stats[0, :3, 1, 2] == 0)


def test_colour_statistics_weigh_pixels_by_chroma_squared():
    """Two pixels in a cell of 1 x 2: red (chroma 0.8) and a dull blue (chroma 0.2): weights 0.64 and 0.04."""
    img = torch.tensor([[[0.9, 0.3]], [[0.1, 0.3]], [[0.1, 0.5]]], dtype=torch.float64)[None]  # (1, 3, 1, 2)
    stats = colour_statistics(img, (1, 1))[0, :, 0, 0]
    w = torch.tensor([0.64, 0.04], dtype=torch.float64)
    expected = (img[0].reshape(3, 2) * w).mean(1) / (w.mean() + 1e-4)  # cell means, the 1e-4 guard on the mean weight
    torch.testing.assert_close(stats[:3], expected, rtol=0, atol=1e-12)
    assert stats[3].item() == pytest.approx(0.5)


def test_projector_with_colour_statistics_starts_as_the_one_without():
    """A v2 projector's weights load into a v4 one (only ``colour.*`` missing) and give the same tokens:
    the colour branch starts at zero. Then a change of one column's colour moves that column's tokens only."""
    torch.manual_seed(0)
    old = Projector(hidden=8, grid=(2, 3), mlp_dim=16).eval()
    new = Projector(hidden=8, grid=(2, 3), mlp_dim=16, colour_stats=True).eval()
    missing, unexpected = new.load_state_dict(old.state_dict(), strict=False)
    assert sorted(missing) == ["colour.bias", "colour.weight"] and not unexpected
    maps, mid, px = torch.rand(1, FEATURE_DIM, 4, 6), torch.rand(1, MID_FEATURE_DIM, 8, 12), torch.rand(1, 3, 12, 18)
    with torch.no_grad():
        torch.testing.assert_close(new(maps, mid, px), old(maps, mid), rtol=0, atol=0)
        new.colour.weight.normal_()
        base = new(maps, mid, px)
        moved = px.clone()
        moved[0, 0, 0:6, 12:18] = 1.0  # column 2's top cell turns red-ish
        diff = (new(maps, mid, moved) - base).abs().sum(-1)[0]
    assert torch.all(diff[4:] > 0) and torch.all(diff[:4] == 0)
    assert new.pool(maps, mid, px).shape == (1, *new.pooled_shape) == (1, 3, 2 * (FEATURE_DIM + MID_FEATURE_DIM + COLOUR_STATS))
    with pytest.raises(ValueError, match="pixels"):
        new.pool(maps, mid)


# --- free shapes' column words (stage 1) ---------------------------------------------------------------
THIRD = SIZE / 3


def test_area_in_columns_by_hand():
    square = Shape("red", "square", "left", x=40, y=100, side=40)  # 20..60: all in the left third
    np.testing.assert_allclose(area_in_columns(square), [1600, 0, 0])
    split = Shape("red", "square", "left", x=round(THIRD), y=100, side=40)  # 55..95 around the border 74.67
    left = (THIRD - 55) * 40
    np.testing.assert_allclose(area_in_columns(split), [left, 1600 - left, 0], atol=0.25 * 40)
    circle = Shape("red", "circle", "middle", x=112, y=100, side=40)
    assert area_in_columns(circle).sum() == pytest.approx(math.pi * 400, rel=1e-3)
    triangle = Shape("red", "triangle", "middle", x=112, y=100, side=40)
    assert area_in_columns(triangle).sum() == pytest.approx(800, rel=1e-3)


def test_free_shapes_name_the_columns_they_fill():
    big = Shape("blue", "circle", "middle", x=112, y=112, side=190)  # 17..207: most of all three
    assert cell_words(Scene((big,))) == ["blue", "circle"] * 3
    small = Shape("red", "square", "right", x=190, y=50, side=24)  # inside the right third
    assert cell_words(Scene((small,))) == ["nothing", "nothing", "nothing", "nothing", "red", "square"]
    # a sliver: 6 px of a 40 px square in the middle third (15% of it, 240 px^2 < a tenth of the column)
    sliver = Shape("green", "square", "left", x=round(THIRD) - 14, y=100, side=40)
    words = cell_words(Scene((sliver,)))
    assert words[:2] == ["green", "square"] and words[2:] == ["nothing"] * 4
    # two shapes in one column: the one with more area there names it
    a = Shape("yellow", "square", "middle", x=100, y=50, side=30)
    b = Shape("red", "square", "middle", x=120, y=150, side=40)
    assert column_holder((a, b), 1) is b and column_holder((a, b), 0) is None
