"""Small builders shared by the unit tests."""

from __future__ import annotations

import numpy as np
import torch
from transformers.cache_utils import DynamicCache

from videokv_node.memory.question import Frame


def random_frames(n: int, seed: int = 0, camera: str = "cam", start_s: int = 1, h: int = 24, w: int = 32) -> list[Frame]:
    rng = np.random.default_rng(seed)
    return [
        Frame(camera, (start_s + i) * 10**9, rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for i in range(n)
    ]


def plain_forward(adapter, frames: list[Frame], question_ids: list[int], offset: int = 0):
    """One forward over [prefix, all frames, question] with no memory at all: the reference.

    Returns (last logits, cache) with positions starting at ``offset``.
    """
    feats = adapter.encode_frames([f.rgb for f in frames])  # (F, T, hidden)
    embeds = torch.cat(
        [
            adapter.embed_tokens(adapter.prefix_ids()),
            feats.reshape(1, -1, feats.shape[-1]),
            adapter.embed_tokens(question_ids),
        ],
        dim=1,
    )  # (1, N, hidden)
    cache = DynamicCache()
    positions = stream_positions(adapter, len(adapter.prefix_ids()), len(frames), len(question_ids), offset)
    logits = adapter.forward(embeds, positions, cache)
    return logits, cache


def stream_positions(adapter, n_prefix: int, n_frames: int, n_question: int, offset: int = 0) -> torch.Tensor:
    """(P, N) positions of [prefix text, frames, question text] as the model itself numbers them
    (1-D: consecutive; mRoPE: each frame a (t, h, w) grid advancing by ``frame_span``)."""
    parts = [adapter.text_positions(offset, n_prefix)]
    start = offset + n_prefix
    for _ in range(n_frames):
        parts.append(adapter.frame_positions(start))
        start += adapter.frame_span
    parts.append(adapter.text_positions(start, n_question))
    return torch.cat(parts, dim=1)


def greedy_tokens(adapter, logits, cache, next_pos: int, max_new: int) -> list[int]:
    """Greedy token ids continuing a forward whose last logits are ``logits``."""
    out = []
    for _ in range(max_new):
        token = int(torch.argmax(logits))
        if token in adapter.eos_token_ids:
            break
        out.append(token)
        logits = adapter.forward(adapter.embed_tokens([token]), torch.tensor([next_pos]), cache)
        next_pos += 1
    return out


def greedy(adapter, logits, cache, next_pos: int, max_new: int) -> str:
    return adapter.decode(greedy_tokens(adapter, logits, cache, next_pos, max_new)).strip()


def block_keys(block) -> torch.Tensor:
    """(L, H, T, D) stored keys of an uncompressed resident block."""
    return torch.stack([kv.keys for kv in block.layers])


def block_values(block) -> torch.Tensor:
    return torch.stack([kv.values for kv in block.layers])


def scene(n: int, seed: int = 0, scene_len: int = 4) -> list[Frame]:
    """Frames of a few 'scenes': near-identical 8x8 frames inside one, so segmenters see real boundaries;
    one camera, frame i stamped (i + 1) s."""
    rng = np.random.default_rng(seed)
    frames, base = [], None
    for i in range(n):
        if i % scene_len == 0:
            base = rng.integers(0, 256, (8, 8, 3)).astype(np.int16)
        img = np.clip(base + rng.integers(-3, 4, (8, 8, 3)), 0, 255).astype(np.uint8)
        frames.append(Frame("/cam", (i + 1) * 10**9, img))
    return frames


def random_features(projector, examples, seed: int):
    """The examples' distinct scenes (sorted by seed) and seeded random pooled features for each: what
    videokv-tiny's trainer reads in place of the frozen encoder's cached features."""
    gen = torch.Generator().manual_seed(seed)
    scenes = sorted({s for ex in examples for s in ex.scenes}, key=lambda s: s.seed)
    return scenes, {s: torch.rand(*projector.pooled_shape, generator=gen) for s in scenes}
