"""Words for drawn things: a small head on the frozen encoder's maps that names the coloured shapes a frame
shows ("red triangle"), ``videokv-tiny`` v6 (issue 43).

Why: v5 writes a frame's nouns from the encoder's ImageNet classifier, which has no class for a red
triangle drawn on a poster, so a planner's "where did you see the red triangle?" found nothing
(``~/locate`` of drawn shapes 0/12 at the hour) and the decoder had to read a shape's colour from six
pooled visual tokens, which it did in 37% of the hour's questions. This head writes the shape's words
into the same word block as the classifier's nouns, where the memory's word index and the decoder read
them like any noun (``models/nouns.py``: ``NounBlock`` with ``extra`` words).

What it reads, per cell of the encoder's 7 x 7 final map: the 1,280 final channels, the 80 channels of
the fourth stage averaged to the same grid, and the cell's colour statistics of the frame's pixels
(``colour_statistics``: chroma-weighted mean RGB and mean chroma, as v4's projector reads them per
column; ``colour_spread``: how flat that colour is). A two-layer MLP per cell gives one logit per drawn thing (``THING_NAMES``: 4 colours x 3
shapes), and a frame's logit for a thing is the largest over its cells (multiple-instance pooling: a
shape anywhere, of any size from a fifth of the frame's height up, is that thing in the frame; two
things in one frame are two words). Matrix products, a GELU and a max, so the vision backends' ONNX
export carries it with the encoder (tests/unit/test_vision_export.py).

The decoder never sees the head's probabilities, only the words it writes (at ``NounBlock``'s
``extra_threshold``); trained by ``python -m videokv_node.tinyvlm.train_things_head`` on real footage
with shapes drawn in, held out by source (``tinyvlm/drawn.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from videokv_node.models.efficientnet_lite import FEATURE_DIM, MID_FEATURE_DIM
from videokv_node.models.pooling import COLOUR_STATS, colour_statistics, grid_pool

THING_COLOURS = ("red", "green", "blue", "yellow")  # as tinyvlm.scenes.COLOURS (a test checks they agree)
THING_SHAPES = ("circle", "square", "triangle")  # as tinyvlm.scenes.SHAPES
THING_NAMES = tuple(f"{c} {s}" for c in THING_COLOURS for s in THING_SHAPES)  # the words it writes, in logit order
CELL_COLOUR = COLOUR_STATS + 3  # per cell: colour_statistics, then the spread of the coloured pixels' RGB (colour_spread)


def colour_spread(pixels: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(B, 3, H, W) RGB in [0, 1] -> (B, 3, rows, cols): per cell, the standard deviation of each channel over the
    cell's pixels weighted by their chroma squared (the weighting of ``colour_statistics``).

    Why: the first head, without it, named the red bow tie of carphone_pristine.mp4 a "red triangle" in 34 of the
    held-out split's frames (and oranges yellow circles): a drawn shape is one flat colour (sensor noise and blur
    aside), a real thing of that colour is shaded and textured. Matrix products and a square root: exportable."""
    chroma = pixels.amax(1, keepdim=True) - pixels.amin(1, keepdim=True)
    w = chroma * chroma
    s0, s1, s2 = grid_pool(w, grid), grid_pool(pixels * w, grid), grid_pool(pixels * pixels * w, grid)
    # the weighted variance (s2 s0 - s1^2) / s0^2, exactly 0 for one flat colour; a cell with no colour gives 0
    return ((s2 * s0 - s1 * s1) / (s0 * s0 + 1e-8)).clamp_min(0.0).add(1e-8).sqrt()


def cell_colour(pixels: torch.Tensor, grid: int) -> torch.Tensor:
    """(B, 3, H, W) RGB in [0, 1] -> (B, grid * grid, CELL_COLOUR): what the head reads of the pixels per cell."""
    g = (grid, grid)
    return torch.cat([colour_statistics(pixels, g), colour_spread(pixels, g)], 1).flatten(2).transpose(1, 2)
HEAD_FILE = "things.safetensors"  # beside the weights, when the manifest has a ``things`` entry


class ThingHead(nn.Module):
    """Encoder maps and pixels -> (B, len(THING_NAMES)) logits of "this frame shows a <colour> <shape>"."""

    def __init__(self, hidden: int = 96, grid: int = 7, names: tuple[str, ...] = THING_NAMES,
                 feature_dim: int = FEATURE_DIM, mid_dim: int = MID_FEATURE_DIM):
        super().__init__()
        self.names = tuple(names)
        self.grid = grid
        self.in_dim = feature_dim + mid_dim + CELL_COLOUR
        self.norm = nn.LayerNorm(feature_dim + mid_dim)
        self.fc1 = nn.Linear(self.in_dim, hidden)
        self.drop = nn.Dropout(0.0)  # training sets it (train_things_head --dropout); nothing at inference
        self.fc2 = nn.Linear(hidden, len(self.names))

    def config(self) -> dict:
        """The manifest's ``things`` entry (``names`` in logit order)."""
        return {"hidden": self.fc1.out_features, "grid": self.grid, "names": list(self.names)}

    def cells(self, maps: torch.Tensor, mid: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 1280, h, w), (B, 80, h', w') maps and (B, 3, S, S) RGB in [0, 1] -> (B, grid * grid, in_dim): what the
        MLP reads per cell, before its LayerNorm (what training caches: the encoder is frozen)."""
        return torch.cat([self.map_cells(maps, mid), cell_colour(pixels, self.grid)], -1)

    def map_cells(self, maps: torch.Tensor, mid: torch.Tensor) -> torch.Tensor:
        """The encoder maps' part of ``cells``: (B, grid * grid, C + M)."""
        g = (self.grid, self.grid)
        return torch.cat([grid_pool(maps, g), grid_pool(mid, g)], 1).flatten(2).transpose(1, 2)

    def cell_logits(self, cells: torch.Tensor) -> torch.Tensor:
        """(..., cells, in_dim) -> (..., cells, things); the colour statistics centred on 0 (they lie in [0, 1])."""
        n = self.norm.normalized_shape[0]
        x = torch.cat([self.norm(cells[..., :n]), 2 * cells[..., n:] - 1], -1)
        return self.fc2(self.drop(F.gelu(self.fc1(x))))

    def logits_from_cells(self, cells: torch.Tensor) -> torch.Tensor:
        return self.cell_logits(cells).amax(-2)

    def forward(self, maps: torch.Tensor, mid: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        return self.logits_from_cells(self.cells(maps, mid, pixels))
