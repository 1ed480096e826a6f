"""``videokv-tiny``'s training set: the questions (the data recipe) and the frozen encoder's features of their frames.

``build_examples`` draws every question from one seed; ``pooled_features`` runs each distinct scene
through the frozen encoder once and pools it as the projector reads it, and ``cached_features``
keeps the encoder's part in a file between runs (encoding is most of a run's cost on 2 CPU cores);
a projector's colour statistics (v4) need only the render and are computed afresh each run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from videokv_node.models.efficientnet_lite import normalise
from videokv_node.models.videokv_tiny import Projector
from videokv_node.tinyvlm.render import render
from videokv_node.tinyvlm.scenes import Example, Scene, SceneSampler
from videokv_node.tinyvlm.variety import OPTION_VALUES, VariedSampler, with_letter_options


def build_examples(seed: int, n_frame: int, n_stream: int, pool: int, max_stream: int, n_photo: int = 0,
                   photo_crops: int = 0, n_varied: int = 0, varied_pool: int = 0, letter_share: float = 0.0) -> list[Example]:
    """The data set: ``n_frame`` single-frame questions then ``n_stream`` stream questions of 2 to
    ``max_stream`` frames, about column scenes from a pool of about ``pool``, then ``n_photo`` questions about
    ``photo_crops`` crops of each real photo, then ``n_varied`` questions about free-shape scenes on varied
    backgrounds (``tinyvlm.variety.VariedSampler``, a pool of about ``varied_pool``; never a held-out size,
    background or wording), shuffled by ``seed``.

    ``letter_share``: that share of the column, stream and varied questions whose kind has a fixed answer set
    (``OPTION_VALUES``) is asked as multiple choice in the node's letter format (``with_letter_options``), drawn
    by a generator of its own so the questions themselves are those of ``letter_share`` 0."""
    sampler = SceneSampler(seed, pool=pool, photo_crops=photo_crops)
    examples = [sampler.frame_question() for _ in range(n_frame)]
    examples += [sampler.stream_question(n_max=max_stream) for _ in range(n_stream)]
    if n_varied:
        varied = VariedSampler(seed, pool=varied_pool or None)
        examples += [varied.question() for _ in range(n_varied)]
    if letter_share:
        rng = np.random.default_rng([seed, 2])
        examples = [with_letter_options(ex, OPTION_VALUES[ex.kind], rng)
                    if ex.kind in OPTION_VALUES and rng.random() < letter_share else ex for ex in examples]
    examples += [sampler.photo_question() for _ in range(n_photo)]
    order = torch.randperm(len(examples), generator=torch.Generator().manual_seed(seed))
    return [examples[i] for i in order]


def _pixels(scenes: list[Scene]) -> torch.Tensor:
    return torch.stack([torch.from_numpy(render(s)).permute(2, 0, 1) for s in scenes]).float() / 255.0  # (b, 3, 224, 224)


@torch.inference_mode()
def pooled_features(encoder, projector: Projector, scenes: list[Scene], batch: int = 16,
                    logits: dict[Scene, torch.Tensor] | None = None) -> dict[Scene, torch.Tensor]:
    """Scene -> (cols, rows * (1280 + 80)) pooled frozen encoder features (``Projector.pool_maps``), each
    distinct scene encoded once. ``logits`` (v5's noun block): filled with each scene's (1000,) ImageNet
    logits from the same pass."""
    unique = list(dict.fromkeys(scenes))
    out = {}
    for i in range(0, len(unique), batch):
        chunk = unique[i : i + batch]
        maps, mid = encoder.feature_levels(normalise(_pixels(chunk)))
        out.update(zip(chunk, projector.pool_maps(maps, mid)))
        if logits is not None:
            logits.update(zip(chunk, encoder.classify(maps)))
    return out


@torch.inference_mode()
def colour_features(projector: Projector, scenes: list[Scene], batch: int = 64) -> dict[Scene, torch.Tensor]:
    """Scene -> (cols, rows * COLOUR_STATS): the colour statistics' part of ``Projector.pool`` (no encoder)."""
    unique = list(dict.fromkeys(scenes))
    out = {}
    for i in range(0, len(unique), batch):
        chunk = unique[i : i + batch]
        out.update(zip(chunk, projector.pool_colour(_pixels(chunk))))
    return out


def cached_features(path: Path | None, encoder, projector: Projector, scenes: list[Scene],
                    logits: dict[Scene, torch.Tensor] | None = None) -> dict[Scene, torch.Tensor]:
    """Scene -> (cols, ``projector.column_dim``), what ``Projector.pool`` gives: the encoder's part kept in
    ``path`` between runs (only scenes the file lacks are encoded), the colour statistics' part (a projector
    with ``colour_stats``) computed from the renders. ``logits`` (v5): filled with every scene's ImageNet
    logits, kept in the file too (a file without them is encoded afresh)."""
    unique = list(dict.fromkeys(scenes))
    features = {}
    if path is not None and path.is_file():
        saved = torch.load(path, weights_only=False)
        if logits is None or "logits" in saved:
            wanted = set(unique)
            features = {s: f for s, f in zip(saved["scenes"], saved["features"]) if s in wanted}
            if logits is not None:
                logits.update((s, x) for s, x in zip(saved["scenes"], saved["logits"]) if s in wanted)
    if len(features) < len(unique):
        features.update(pooled_features(encoder, projector, [s for s in unique if s not in features], logits=logits))
        if path is not None:
            saved = {"scenes": unique, "features": torch.stack([features[s] for s in unique])}
            if logits is not None:
                saved["logits"] = torch.stack([logits[s] for s in unique])
            torch.save(saved, path)
    if projector.colour_stats:
        colour = colour_features(projector, unique)
        features = {s: torch.cat([f, colour[s]], -1) for s, f in features.items()}
    return features
