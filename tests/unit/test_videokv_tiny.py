"""videokv-tiny: the adapter contract, every memory policy against a plain forward, and its training step.

These run on ``videokv-tiny-random`` (the same code, random weights, a 2-layer decoder,
64 px frames): seconds, no files. The committed weights are checked in
test_videokv_tiny_weights.py.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from tests.unit.helpers import greedy, plain_forward, random_features, random_frames
from tests.unit.test_policy_parity import ATOL, N_FRAMES, UNBOUNDED, engine_for, ref_next_position
from videokv_node.memory import Question
from videokv_node.models import load_adapter
from videokv_node.models.efficientnet_lite import FEATURE_DIM, MID_FEATURE_DIM
from videokv_node.models.tiny_tokenizer import build_tiny_tokenizer
from videokv_node.tinyvlm.scenes import SceneSampler, cell_words
from videokv_node.tinyvlm.align import cell_targets
from videokv_node.tinyvlm.dataset import build_examples
from videokv_node.tinyvlm.train import train
from videokv_node.tinyvlm.trainer import ProjectorTrainer
from videokv_node.models.pooling import grid_pool
from videokv_node.models.videokv_tiny import Projector, tiny_llama_config


@pytest.fixture(scope="module")
def adapter():
    return load_adapter("videokv-tiny-random", device="cpu")


def test_frames_of_any_size_become_rows_x_cols_tokens_of_the_decoder_width(adapter):
    frames = [f.rgb for f in random_frames(2, seed=1, h=24, w=32)] + [f.rgb for f in random_frames(1, seed=2, h=90, w=60)]
    feats = adapter.encode_frames(frames)
    assert adapter.tokens_per_frame == 6 and adapter.frame_span == 6
    assert feats.shape == (3, adapter.tokens_per_frame, adapter.model.config.hidden_size)
    assert feats.dtype == adapter.geometry.dtype
    g = adapter.geometry
    assert (g.n_layers, g.n_q_heads, g.n_kv_heads, g.head_dim) == (2, 4, 2, 16)


def test_projector_emits_each_columns_tokens_from_that_column_alone():
    """Tokens 2c and 2c + 1 of a frame come from column c of both maps (both rows): a change in one
    cell of column 2, in either map, moves those two tokens and no other."""
    projector = Projector(hidden=8, grid=(2, 3), mlp_dim=16).eval()
    maps, mid = torch.rand(1, FEATURE_DIM, 4, 6), torch.rand(1, MID_FEATURE_DIM, 8, 12)
    with torch.no_grad():
        base = projector(maps, mid)
        moved_final = maps.clone()
        moved_final[0, :, 2:4, 4:6] += 1.0  # cell (1, 2) of the final map
        moved_mid = mid.clone()
        moved_mid[0, :, 0:4, 8:12] += 1.0  # cell (0, 2) of the mid map
        for out in (projector(moved_final, mid), projector(maps, moved_mid)):
            diff = (out - base).abs().sum(-1)[0]  # (6,)
            assert diff.shape == (6,)
            assert torch.all(diff[4:] > 0) and torch.all(diff[:4] == 0)
    assert projector.pool(maps, mid).shape == (1, *projector.pooled_shape)


@pytest.mark.parametrize("h, w", [(7, 7), (14, 14), (2, 2), (4, 4), (5, 9), (3, 2)])
def test_grid_pool_equals_adaptive_average_pooling(h, w):
    x = torch.rand(2, 5, h, w, dtype=torch.float64)
    torch.testing.assert_close(grid_pool(x, (2, 3)), torch.nn.functional.adaptive_avg_pool2d(x, (2, 3)), rtol=0, atol=1e-12)


def test_random_variant_is_reproducible_and_isolated_from_the_global_rng(adapter):
    torch.manual_seed(5)
    expected = torch.rand(2)
    torch.manual_seed(5)
    other = load_adapter("videokv-tiny-random", device="cpu")
    assert torch.equal(torch.rand(2), expected)
    assert other.fingerprint() == adapter.fingerprint()
    assert load_adapter("videokv-tiny-random", device="cpu", seed=1).fingerprint() != adapter.fingerprint()


@pytest.mark.parametrize("name", sorted(UNBOUNDED))
def test_unbounded_policy_equals_plain_forward(adapter, name):
    """As tests/unit/test_policy_parity.py for the other models: every policy runs unchanged on this one."""
    frames = random_frames(N_FRAMES, seed=7)
    engine = engine_for(adapter, **UNBOUNDED[name])
    for f in frames:
        engine.ingest([f])
    q_ids = adapter.question_ids("what colour came first?", [])
    ref_logits, ref_cache = plain_forward(adapter, frames, q_ids)
    answer = engine.ask(Question("what colour came first?", max_new_tokens=6))
    torch.testing.assert_close(engine.last_logits, ref_logits, rtol=0, atol=ATOL)
    assert answer.text == greedy(adapter, ref_logits, ref_cache, ref_next_position(adapter, frames, q_ids), 6)
    assert [e.stamp_ns for e in answer.evidence] == [f.stamp_ns for f in frames]


def test_a_few_training_steps_on_a_tiny_batch_lower_the_loss():
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(0)
    # Larger random weights than transformers' 0.02: with those, logits are near flat whatever the input
    # (loss ~ ln(vocab)), so no projector could lower the loss; a trained decoder is not flat.
    llm = LlamaForCausalLM(tiny_llama_config(tokenizer, initializer_range=0.5)).eval()
    projector = Projector(llm.config.hidden_size, mlp_dim=32)
    examples = build_examples(seed=3, n_frame=3, n_stream=1, pool=12, max_stream=3)
    scenes = {s for ex in examples for s in ex.scenes}
    gen = torch.Generator().manual_seed(0)
    features = {s: torch.rand(*projector.pooled_shape, generator=gen) for s in sorted(scenes, key=lambda s: s.seed)}
    trainer = ProjectorTrainer(llm, tokenizer, projector, features)
    frozen = {k: v.clone() for k, v in llm.state_dict().items()}
    before = trainer.loss(examples).item()
    train(trainer, examples, steps=20, batch=len(examples), lr=3e-2, seed=0, log_every=20)
    after = trainer.loss(examples).item()
    assert after < 0.8 * before, (before, after)
    assert all(torch.equal(v, llm.state_dict()[k]) for k, v in frozen.items()), "the decoder must stay frozen"


def test_stage_two_adds_the_weighted_alignment_loss_of_the_batchs_frames():
    """loss(align_weight=w) = answer loss + w * mean((tokens - word embeddings)^2) / mean(embeddings^2),
    over the distinct frames of the batch, each aligned to its cell_words."""
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(0)
    llm = LlamaForCausalLM(tiny_llama_config(tokenizer)).eval()
    projector = Projector(llm.config.hidden_size, mlp_dim=32)
    examples = build_examples(seed=5, n_frame=2, n_stream=1, pool=12, max_stream=3)
    scenes, features = random_features(projector, examples, seed=1)
    plain = ProjectorTrainer(llm, tokenizer, projector, features).loss(examples)
    leashed = ProjectorTrainer(llm, tokenizer, projector, features, align_weight=0.5).loss(examples)
    embed = llm.get_input_embeddings()
    targets, scale = cell_targets(features, tokenizer, embed)
    words = [embed(torch.tensor(tokenizer.encode(w if w.isdigit() else f" {w}", add_special_tokens=False))).mean(0)
             for w in cell_words(scenes[0])]
    torch.testing.assert_close(targets[scenes[0]], torch.stack(words))
    mse = sum((projector.project(features[s]) - targets[s]).pow(2).sum() for s in scenes) / (len(scenes) * targets[scenes[0]].numel())
    torch.testing.assert_close(leashed, plain + 0.5 * mse / scale)


def test_training_loss_sees_the_answer_exactly_as_the_adapter_lays_it_out(adapter):
    """The trainer's sequence is [prefix][frames][question_ids][answer]: same ids as the adapter's prompt."""
    llm, tok = adapter.model, adapter.tokenizer
    trainer = ProjectorTrainer(llm, tok, adapter.projector, {})
    assert trainer.prefix == adapter.prefix_ids()
    assert trainer.question_ids("Which colour came first?") == adapter.question_ids("Which colour came first?", [])


def test_scene_sampler_is_deterministic():
    a = [SceneSampler(4, pool=20).stream_question() for _ in range(3)]
    b = [SceneSampler(4, pool=20).stream_question() for _ in range(3)]
    assert a == b


def test_gapped_positions_keep_frames_whole_and_gaps_within_bounds():
    from videokv_node.tinyvlm.trainer import gapped_positions

    gen = torch.Generator().manual_seed(0)
    assert gapped_positions(5, 2, 3, 4, 0, gen).tolist() == list(range(5, 15))  # no gap: back to back
    for _ in range(50):
        pos = gapped_positions(23, 3, 6, 9, 10, gen)
        assert len(pos) == 3 * 6 + 9 and pos[0] >= 23 and bool((pos[1:] > pos[:-1]).all())
        steps = (pos[1:] - pos[:-1]).tolist()
        inner = [steps[i] for i in range(len(steps)) if (i + 1) % 6 != 0 or i + 1 > 18]  # within a frame or the text
        assert all(s == 1 for s in inner)
        assert pos[0] - 23 <= 10 and all(1 <= s <= 11 for s in steps)


def test_training_with_position_gaps_changes_the_layout_not_the_data():
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(0)
    llm = LlamaForCausalLM(tiny_llama_config(tokenizer)).eval()
    projector = Projector(llm.config.hidden_size, mlp_dim=32)
    examples = build_examples(seed=3, n_frame=3, n_stream=2, pool=12, max_stream=3)
    _, features = random_features(projector, examples, seed=0)
    plain = ProjectorTrainer(llm, tokenizer, projector, features).loss(examples)
    never = ProjectorTrainer(llm, tokenizer, projector, features, max_gap=50, gap_share=0.0).loss(examples)
    always = ProjectorTrainer(llm, tokenizer, projector, features, max_gap=50, gap_share=1.0, seed=1).loss(examples)
    torch.testing.assert_close(never, plain)
    assert not torch.allclose(always, plain)
    again = ProjectorTrainer(llm, tokenizer, projector, features, max_gap=50, gap_share=1.0, seed=1).loss(examples)
    torch.testing.assert_close(again, always)  # seeded
