"""Batched prefill (``memory/context/batch_prefill.py``) against frame-by-frame ingest.

Several queued frames in one decoder pass must make the blocks frame-by-frame ingest makes:
the same block ids, stamps, tiers, positions, keys, values and retrieval keys, and then the
same answers; on the tiny LLaVA-OneVision in float64 (tolerance 1e-9) and the tiny
Qwen2.5-VL (mRoPE, float32). The window slides within a batch, the caps offload (and the
arena evicts) between two frames of a batch, and frames of several cameras interleave.
Policies without a ``batch_window`` take the frame-by-frame path for a list too (same result).
"""

from __future__ import annotations

import pytest
import torch

from tests.unit.helpers import random_frames
from videokv_node.memory import GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.memory.context.batch_prefill import window_starts
from videokv_node.memory.config import HermesConfig, MuKVConfig, StreamKVConfig

N_FRAMES = 11  # chunks of 4, 4 and 3


def frames_of_cameras(n: int, seed: int):
    """Frames of two cameras, interleaved in time."""
    frames = random_frames(n, seed=seed)
    for i, f in enumerate(frames):
        f.camera = f"cam{i % 2}"
    return frames


def rekv_config(adapter, window_frames: int, resident_frames: int, offload_frames: int, prefill_batch: int) -> MemoryConfig:
    T = adapter.tokens_per_frame
    sink = len(adapter.prefix_ids())
    bytes_per_frame = T * adapter.geometry.bytes_per_token
    return MemoryConfig(
        policy="rekv", budget_tokens=sink + resident_frames * T, local_window_tokens=window_frames * T or 1,
        offload_bytes=offload_frames * bytes_per_frame, page_tokens=1, retrieve_frames=2, prefill_batch=prefill_batch,
    )


def assert_same_memory(one: VideoMemoryEngine, batched: VideoMemoryEngine, atol: float) -> None:
    a, b = list(one.store.blocks()), list(batched.store.blocks())
    assert [(x.block_id, x.camera, x.stamp_ns, x.tier) for x in a] == [(x.block_id, x.camera, x.stamp_ns, x.tier) for x in b]
    assert one.store.evicted_blocks == batched.store.evicted_blocks
    for x, y in zip(a, b):
        assert torch.equal(x.positions, y.positions)
        torch.testing.assert_close(y.key_mean, x.key_mean, rtol=0, atol=max(atol, 1e-6))  # kept in float32
        assert [kv is None for kv in x.layers] == [kv is None for kv in y.layers]
        for layer in (l for l, kv in enumerate(x.layers) if kv is not None):
            kx, vx = one.store.layer_kv(x, layer)
            ky, vy = batched.store.layer_kv(y, layer)
            torch.testing.assert_close(ky, kx, rtol=0, atol=atol)
            torch.testing.assert_close(vy, vx, rtol=0, atol=atol)


def ask_both(one: VideoMemoryEngine, batched: VideoMemoryEngine, atol: float) -> None:
    for question in (Question("what is on the table?", max_new_tokens=4), Question("which one?", options=["a cup", "a ball"])):
        x, y = one.ask(question), batched.ask(question)
        torch.testing.assert_close(batched.last_logits, one.last_logits, rtol=0, atol=atol)
        assert y.text == x.text
        assert [e.stamp_ns for e in y.evidence] == [e.stamp_ns for e in x.evidence]


@pytest.mark.parametrize("model", ["llava64", "qwen"])
@pytest.mark.parametrize("window_frames, resident_frames, offload_frames", [(3, 5, 3), (20, 30, 0), (0, 2, 1)])
def test_rekv_batched_prefill_equals_frame_by_frame(request, model, window_frames, resident_frames, offload_frames):
    adapter = request.getfixturevalue("tiny_adapter64" if model == "llava64" else "tiny_qwen")
    atol = 1e-5 if model == "llava64" else 1e-4
    frames = frames_of_cameras(N_FRAMES, seed=3)
    one = VideoMemoryEngine(adapter, rekv_config(adapter, window_frames, resident_frames, offload_frames, 1), GenerationConfig())
    batched = VideoMemoryEngine(adapter, rekv_config(adapter, window_frames, resident_frames, offload_frames, 4), GenerationConfig())
    for f in frames[:2]:  # a memory to start from
        one.ingest([f])
        batched.ingest([f])
    for f in frames[2:]:
        one.ingest([f])
    batched.ingest(frames[2:])  # chunks of 4, 4 and 1
    assert_same_memory(one, batched, atol)
    assert one.stats().frames_ingested == batched.stats().frames_ingested == N_FRAMES
    ask_both(one, batched, atol)


def test_questions_run_between_chunks(tiny_adapter64):
    """``between`` runs after each chunk but the last, the memory complete up to the chunk's end."""
    engine = VideoMemoryEngine(tiny_adapter64, rekv_config(tiny_adapter64, 4, 30, 0, 4), GenerationConfig())
    seen = []
    engine.ingest(random_frames(10, seed=1), between=lambda: seen.append(len(engine.store)))
    assert seen == [4, 8]


OTHERS = {
    "full": dict(policy="full"),
    "streamkv": dict(policy="streamkv", streamkv=StreamKVConfig(min_segment_frames=2, max_segment_frames=4, compression_ratio=0.5)),
    "hermes": dict(policy="hermes", hermes=HermesConfig(chunk_frames=2)),
    "mukv": dict(policy="mukv", mukv=MuKVConfig(granularities=("frame", "segment"), segment_frames=2)),
}


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_other_policies_take_a_list_frame_by_frame(tiny_adapter64, name):
    """No ``batch_window`` (segments, compression or attention-based caps between frames): a list
    is ingested one pass per frame, the same memory as one call per frame."""
    def engine():
        cfg = MemoryConfig(budget_tokens=4096, local_window_tokens=64, offload_bytes=1 << 22, prefill_batch=4, **OTHERS[name])
        return VideoMemoryEngine(tiny_adapter64, cfg, GenerationConfig())

    one, batched = engine(), engine()
    assert batched.policy.batch_window() is None
    frames = frames_of_cameras(7, seed=5)
    for f in frames:
        one.ingest([f])
    batched.ingest(frames)
    assert_same_memory(one, batched, 1e-9)
    ask_both(one, batched, 1e-9)


def test_window_starts_by_hand():
    # context of three 6-token blocks, three 6-token units; a 12-token window slides one item a unit
    assert window_starts([6, 6, 6], [6, 6, 6], 12) == [1, 2, 3]
    assert window_starts([6, 6, 6], [6, 6, 6], 100) == [0, 0, 0]
    assert window_starts([6, 6], [6, 6], 5) == [2, 3]  # nothing fits: empty windows
    assert window_starts([], [4, 4, 4], 8) == [0, 0, 0]
    # the walk stops at the first block that does not fit, as newest_within does
    assert window_starts([2, 9, 2], [2], 6) == [2]
