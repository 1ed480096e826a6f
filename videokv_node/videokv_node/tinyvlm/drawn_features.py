"""The frozen encoder's view of ``tinyvlm/drawn.py``'s frames, computed once and cached: ``encode_drawn``.

One encoder pass per frame gives everything v6's two training stages read: the things head's cells
(``ThingHead.cells``, before its LayerNorm), the ImageNet logits the noun block is written from, and the
projector's pooled columns (``Projector.pool``). Kept in a file between runs (``--feature-cache``), keyed by
the frames' specs, so a resumed run encodes nothing twice.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from videokv_node.models.efficientnet_lite import IMAGE_SIZE, normalise
from videokv_node.tinyvlm.drawn import DrawnFrame, render_drawn

FIELDS = ("cells", "logits", "pooled")


def render_frame(frame) -> np.ndarray:
    """A ``DrawnFrame``'s pixels, or a v5 ``Scene``'s (``tinyvlm/render.py``, 224 px square)."""
    if isinstance(frame, DrawnFrame):
        return render_drawn(frame)
    from videokv_node.tinyvlm.render import render

    return render(frame)


def pixels_of(frames: list[np.ndarray]) -> torch.Tensor:
    """RGB uint8 frames -> (F, 3, S, S) in [0, 1], resized as ``VideoKVTinyAdapter.preprocess`` resizes them."""
    out = []
    for rgb in frames:
        x = torch.from_numpy(np.ascontiguousarray(rgb)).permute(2, 0, 1)[None].float() / 255.0
        out.append(F.interpolate(x, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", antialias=True, align_corners=False))
    return torch.cat(out)


@torch.inference_mode()
def encode(encoder, head, projector, frames: list, batch: int = 32, log=None) -> dict[str, torch.Tensor]:
    """(F, ...) stacks of FIELDS for ``frames``: the encoder maps' cells in float16 (F, 49, 1360: ``ThingHead.map_cells``;
    the pixels' part is ``colour_cells``'s), logits (F, 1000), pooled (F, cols, dim)."""
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in FIELDS}
    for start in range(0, len(frames), batch):
        rgb = pixels_of([render_frame(f) for f in frames[start : start + batch]])
        maps, mid = encoder.feature_levels(normalise(rgb))
        parts["cells"].append(head.map_cells(maps, mid).half())
        parts["logits"].append(encoder.classify(maps))
        parts["pooled"].append(projector.pool(maps, mid, rgb))
        if log is not None and (start // batch) % 20 == 0:
            log(f"encoded {start + len(rgb)}/{len(frames)} frames")
    return {k: torch.cat(v) for k, v in parts.items()}


def encode_drawn(path: Path | None, encoder, head, projector, frames: list, log=None) -> dict[DrawnFrame, dict]:
    """frame -> {field: tensor}; frames already in ``path`` are read from it, the rest encoded and the file rewritten."""
    have: dict[DrawnFrame, dict] = {}
    if path is not None and path.is_file():
        saved = torch.load(path, weights_only=False)
        wanted = set(frames)
        for i, f in enumerate(saved["frames"]):
            if f in wanted:
                have[f] = {k: saved[k][i] for k in FIELDS}
                have[f]["cells"] = have[f]["cells"][:, : head.norm.normalized_shape[0]]  # files before colour_cells
    todo = [f for f in dict.fromkeys(frames) if f not in have]
    if todo:
        got = encode(encoder, head, projector, todo, log=log)
        for i, f in enumerate(todo):
            have[f] = {k: got[k][i] for k in FIELDS}
        if path is not None:
            keys = list(have)
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"frames": keys, **{k: torch.stack([have[f][k] for f in keys]) for k in FIELDS}}, path)
    return have


@torch.inference_mode()
def colour_cells(head, frames: list, batch: int = 64) -> torch.Tensor:
    """(F, 49, CELL_COLOUR) the pixels' part of the head's cells (``cell_colour``), from the renders alone: cheap,
    so never cached (the head's colour features may change between runs, the encoder's maps never do)."""
    from videokv_node.models.things_head import cell_colour

    return torch.cat([cell_colour(pixels_of([render_frame(f) for f in frames[i : i + batch]]), head.grid)
                      for i in range(0, len(frames), batch)])
