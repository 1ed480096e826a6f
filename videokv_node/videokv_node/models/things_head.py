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
column). A two-layer MLP per cell gives one logit per drawn thing (``THING_NAMES``: 4 colours x 3
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
from videokv_node.models.videokv_tiny import COLOUR_STATS, colour_statistics, grid_pool

THING_COLOURS = ("red", "green", "blue", "yellow")  # as tinyvlm.scenes.COLOURS (a test checks they agree)
THING_SHAPES = ("circle", "square", "triangle")  # as tinyvlm.scenes.SHAPES
THING_NAMES = tuple(f"{c} {s}" for c in THING_COLOURS for s in THING_SHAPES)  # the words it writes, in logit order
HEAD_FILE = "things.safetensors"  # beside the weights, when the manifest has a ``things`` entry


class ThingHead(nn.Module):
    """Encoder maps and pixels -> (B, len(THING_NAMES)) logits of "this frame shows a <colour> <shape>"."""

    def __init__(self, hidden: int = 96, grid: int = 7, names: tuple[str, ...] = THING_NAMES,
                 feature_dim: int = FEATURE_DIM, mid_dim: int = MID_FEATURE_DIM):
        super().__init__()
        self.names = tuple(names)
        self.grid = grid
        self.in_dim = feature_dim + mid_dim + COLOUR_STATS
        self.norm = nn.LayerNorm(feature_dim + mid_dim)
        self.fc1 = nn.Linear(self.in_dim, hidden)
        self.fc2 = nn.Linear(hidden, len(self.names))

    def config(self) -> dict:
        """The manifest's ``things`` entry (``names`` in logit order)."""
        return {"hidden": self.fc1.out_features, "grid": self.grid, "names": list(self.names)}

    def cells(self, maps: torch.Tensor, mid: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 1280, h, w), (B, 80, h', w') maps and (B, 3, S, S) RGB in [0, 1] -> (B, grid * grid, in_dim): what the
        MLP reads per cell, before its LayerNorm (what training caches: the encoder is frozen)."""
        g = (self.grid, self.grid)
        feats = torch.cat([grid_pool(maps, g), grid_pool(mid, g)], 1).flatten(2).transpose(1, 2)  # (B, g*g, C+M)
        colour = colour_statistics(pixels, g).flatten(2).transpose(1, 2)  # (B, g*g, 4)
        return torch.cat([feats, colour], -1)

    def cell_logits(self, cells: torch.Tensor) -> torch.Tensor:
        """(..., cells, in_dim) -> (..., cells, things); the colour statistics centred on 0 (they lie in [0, 1])."""
        n = self.norm.normalized_shape[0]
        x = torch.cat([self.norm(cells[..., :n]), 2 * cells[..., n:] - 1], -1)
        return self.fc2(F.gelu(self.fc1(x)))

    def logits_from_cells(self, cells: torch.Tensor) -> torch.Tensor:
        return self.cell_logits(cells).amax(-2)

    def forward(self, maps: torch.Tensor, mid: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
        return self.logits_from_cells(self.cells(maps, mid, pixels))
