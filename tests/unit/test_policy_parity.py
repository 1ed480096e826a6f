"""Every policy against plain transformers forwards.

- ``full`` reproduces one plain forward over [prompt, all frames, question]: the
  first answer token's logits within 1e-4 in float32, and the same greedy answer.
- Every other policy, and the TGV-KV question stage, with budgets at least the
  size of the stream, reproduces ``full`` the same way.
- StreamKV with its summary frames reproduces a plain forward over the stream
  with each segment's summary frame inserted after it, as the paper encodes
  X = [S || f_s]: the summaries are real context, not an approximation.
"""

from __future__ import annotations

import pytest
import torch
from transformers.cache_utils import DynamicCache

from tests.unit.helpers import greedy, plain_forward, random_frames
from videokv_node.memory import GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.memory.config import HermesConfig, MuKVConfig, ReKVConfig, StreamKVConfig, TGVKVConfig

ATOL = 1e-4
N_FRAMES = 6
BIG = 100_000

UNBOUNDED = {
    "full": dict(policy="full"),
    "rekv": dict(policy="rekv", retrieve_frames=BIG),
    "streamkv": dict(
        policy="streamkv",
        streamkv=StreamKVConfig(
            summary_frames=False, compression_ratio=0.0, retrieve_frames=BIG, similarity_threshold=0.99,
            min_segment_frames=2, max_segment_frames=BIG,
        ),
    ),
    "hermes-lazy": dict(policy="hermes", hermes=HermesConfig(reindex="lazy")),
    "hermes-eager": dict(policy="hermes", hermes=HermesConfig(reindex="eager")),
    "mukv": dict(policy="mukv", mukv=MuKVConfig(granularities=("frame",), keep_frame=1.0, retrieve_frame=BIG)),
    "full+tgvkv": dict(policy="full", question_stage="tgvkv", tgvkv=TGVKVConfig(keep_ratio=1.0)),
    # No recent window: every frame goes through the fused ranking (memory.rekv.selection: shared).
    "rekv-shared": dict(policy="rekv", retrieve_frames=BIG, rekv=ReKVConfig(selection="shared", question_window=False)),
    "rekv+tgvkv": dict(policy="rekv", retrieve_frames=BIG, question_stage="tgvkv", tgvkv=TGVKVConfig(keep_ratio=1.0)),
}


def engine_for(adapter, **kw) -> VideoMemoryEngine:
    cfg = dict(budget_tokens=BIG, local_window_tokens=BIG // 2, offload_bytes=1 << 22)
    cfg.update(kw)
    return VideoMemoryEngine(adapter, MemoryConfig(**cfg), GenerationConfig(max_new_tokens=6))


@pytest.fixture(params=["llava", "qwen"])
def adapter(request, tiny_adapter, tiny_qwen):
    return tiny_adapter if request.param == "llava" else tiny_qwen


@pytest.mark.parametrize("name", sorted(UNBOUNDED))
def test_unbounded_policy_equals_plain_forward(adapter, name):
    frames = random_frames(N_FRAMES, seed=7)
    engine = engine_for(adapter, **UNBOUNDED[name])
    for f in frames:
        engine.ingest([f])

    q_ids = adapter.question_ids("what is on the table?", [])
    ref_logits, ref_cache = plain_forward(adapter, frames, q_ids)
    answer = engine.ask(Question("what is on the table?", max_new_tokens=6))
    torch.testing.assert_close(engine.last_logits, ref_logits, rtol=0, atol=ATOL)
    assert answer.text == greedy(adapter, ref_logits, ref_cache, ref_next_position(adapter, frames, q_ids), 6)
    assert [e.stamp_ns for e in answer.evidence] == [f.stamp_ns for f in frames]

    options = ["a cup", "a ball", "nothing"]
    ref_logits, _ = plain_forward(adapter, frames, adapter.question_ids("what is there?", options))
    answer = engine.ask(Question("what is there?", options=options), option_scoring="letter")  # the letters' logits
    ref_probs = torch.softmax(ref_logits[adapter.option_token_ids(3)], 0)
    torch.testing.assert_close(torch.tensor(answer.option_scores), ref_probs.float(), rtol=0, atol=ATOL)


def ref_next_position(adapter, frames, q_ids) -> int:
    """The position after [prompt, frames, question] in a plain forward."""
    return len(adapter.prefix_ids()) + len(frames) * adapter.frame_span + len(q_ids)


def test_tgvkv_never_changes_the_first_token(tiny_adapter):
    """TGV-KV evicts after the prefill: the first token's logits are the policy's, whatever the budget."""
    frames = random_frames(N_FRAMES, seed=8)
    base = engine_for(tiny_adapter, policy="full")
    tight = engine_for(tiny_adapter, policy="full", question_stage="tgvkv", tgvkv=TGVKVConfig(keep_ratio=0.05))
    for f in frames:
        base.ingest([f])
        tight.ingest([f])
    base.ask(Question("where is the robot?", max_new_tokens=3))
    tight.ask(Question("where is the robot?", max_new_tokens=3))
    torch.testing.assert_close(tight.last_logits, base.last_logits, rtol=0, atol=0)
    stage = tight.question_stage
    context = tight.sink.n_tokens + N_FRAMES * tiny_adapter.tokens_per_frame + len(tiny_adapter.question_ids("where is the robot?", []))
    L = tiny_adapter.geometry.n_layers
    assert sum(stage.last_budgets) == -(-5 * context * L // 100)  # ceil(0.05 x entries of the assembled context)


def test_streamkv_summary_frames_equal_a_plain_forward_with_summaries_inserted(tiny_adapter):
    a = tiny_adapter
    frames = random_frames(11, seed=9)
    # Random frames are far apart: every frame is a boundary, so segments close at exactly min_segment_frames.
    cfg = StreamKVConfig(summary_frames=True, compression_ratio=0.0, retrieve_frames=BIG, min_segment_frames=3)
    engine = engine_for(a, policy="streamkv", streamkv=cfg)
    for f in frames:
        engine.ingest([f])
    blocks = sorted(engine.store.blocks(), key=lambda b: b.order)
    kinds = [b.kind for b in blocks]
    assert kinds == ["frame"] * 3 + ["summary"] + ["frame"] * 3 + ["summary"] + ["frame"] * 3 + ["summary"]
    assert len(engine.policy.pending_units()) == 2  # frames 10 and 11 wait in the open segment

    feats = a.encode_frames([f.rgb for f in frames])  # (11, T, hidden)
    sequence = []
    for seg in range(3):
        seg_feats = feats[3 * seg : 3 * seg + 3]
        sequence += list(seg_feats) + [seg_feats.mean(0)]
    sequence += list(feats[9:])
    q_ids = a.question_ids("what changed?", [])
    embeds = torch.cat([a.embed_tokens(a.prefix_ids()), torch.stack(sequence).reshape(1, -1, feats.shape[-1]), a.embed_tokens(q_ids)], 1)
    ref_cache = DynamicCache()
    ref_logits = a.forward(embeds, torch.arange(embeds.shape[1]), ref_cache)
    engine.ask(Question("what changed?", max_new_tokens=1))
    torch.testing.assert_close(engine.last_logits, ref_logits, rtol=0, atol=ATOL)
    # The stored summary blocks are the plain forward's KV at their place in the sequence.
    sink, T = engine.sink.n_tokens, a.tokens_per_frame
    for i, block in enumerate(blocks):
        span = slice(sink + i * T, sink + (i + 1) * T)
        for layer, ref in enumerate(ref_cache.layers):
            torch.testing.assert_close(block.layers[layer].keys, ref.keys[0, :, span], rtol=0, atol=ATOL)
            torch.testing.assert_close(block.layers[layer].values, ref.values[0, :, span], rtol=0, atol=ATOL)
    # Evidence of a summary frame is every frame of its segment; all 11 frames are cited.
    answer = engine.ask(Question("what changed?", max_new_tokens=1))
    assert [e.stamp_ns for e in answer.evidence] == [f.stamp_ns for f in frames]
