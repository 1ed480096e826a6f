"""LoRA adapters on the decoder (models/lora.py): hooked in training, merged for inference, same numbers."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaForCausalLM

from tests.unit.helpers import random_features
from videokv_node.models.lora import DecoderLoRA
from videokv_node.models.tiny_tokenizer import build_tiny_tokenizer
from videokv_node.tinyvlm.dataset import build_examples
from videokv_node.tinyvlm.train import train
from videokv_node.tinyvlm.trainer import ProjectorTrainer
from videokv_node.models.videokv_tiny import Projector, tiny_llama_config


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def decoder(tokenizer, seed=0, **extra):
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config(tokenizer, **extra)).eval()


def randomised(lora: DecoderLoRA, seed: int = 1) -> DecoderLoRA:
    """B is zero at initialisation (the update is nil); give it values so the tests can see it."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for b in lora.B.values():
            b.copy_(torch.randn(b.shape, generator=gen) * 0.1)
    return lora


def test_a_fresh_adapter_changes_nothing(tokenizer):
    llm = decoder(tokenizer)
    ids = torch.tensor([[5, 9, 3, 7]])
    before = llm(ids).logits
    lora = DecoderLoRA(llm, rank=4)
    handles = lora.attach(llm)
    torch.testing.assert_close(llm(ids).logits, before, rtol=0, atol=0)
    for h in handles:
        h.remove()


def test_merged_weights_compute_what_the_hooks_did(tokenizer):
    llm = decoder(tokenizer)
    merged = copy.deepcopy(llm)
    lora = randomised(DecoderLoRA(llm, rank=4, alpha=8.0))
    ids = torch.tensor([[5, 9, 3, 7, 11, 2]])
    plain = llm(ids).logits
    handles = lora.attach(llm)
    hooked = llm(ids).logits
    for h in handles:
        h.remove()
    lora.merge_into(merged)
    assert not torch.allclose(hooked, plain, atol=1e-4), "the update must change the output"
    torch.testing.assert_close(merged(ids).logits, hooked, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(llm(ids).logits, plain, rtol=0, atol=0)  # hooks removed: the decoder is back


def test_only_the_targeted_projections_change_when_merged(tokenizer):
    llm = decoder(tokenizer)
    before = {k: v.clone() for k, v in llm.state_dict().items()}
    randomised(DecoderLoRA(llm, rank=2, targets=("q_proj", "v_proj"))).merge_into(llm)
    changed = {k for k, v in llm.state_dict().items() if not torch.equal(v, before[k])}
    assert changed == {f"model.layers.{i}.self_attn.{t}.weight" for i in range(2) for t in ("q_proj", "v_proj")}


def test_config_rebuilds_an_adapter_its_state_dict_loads_into(tokenizer):
    llm = decoder(tokenizer)
    lora = randomised(DecoderLoRA(llm, rank=3, alpha=6.0, targets=("q_proj",)))
    again = DecoderLoRA.from_config(llm, lora.config())
    again.load_state_dict(lora.state_dict(), strict=True)
    assert again.scale == lora.scale == 2.0
    with pytest.raises(ValueError, match="rank"):
        DecoderLoRA(llm, rank=0)


def trainer_data(tokenizer, llm, seed=3):
    projector = Projector(llm.config.hidden_size, mlp_dim=32)
    examples = build_examples(seed=seed, n_frame=3, n_stream=1, pool=12, max_stream=3)
    _, features = random_features(projector, examples, seed=0)
    return projector, examples, features


def test_trainer_with_adapters_has_the_loss_of_the_merged_decoder(tokenizer):
    """The trainer recomputes the prefix KV under the hooks: its loss is the merged model's, exactly as
    a trainer without adapters computes it on the merged weights."""
    llm = decoder(tokenizer)
    projector, examples, features = trainer_data(tokenizer, llm)
    lora = randomised(DecoderLoRA(llm, rank=4))
    with_lora = ProjectorTrainer(llm, tokenizer, projector, features, lora=lora)
    hooked = with_lora.loss(examples).item()
    with_lora.detach_lora()
    merged = copy.deepcopy(llm)
    lora.merge_into(merged)
    reference = ProjectorTrainer(merged, tokenizer, projector, features).loss(examples).item()
    assert hooked == pytest.approx(reference, rel=1e-5)
    assert ProjectorTrainer(llm, tokenizer, projector, features).loss(examples).item() != pytest.approx(reference, rel=1e-3)


def test_training_moves_the_adapters_and_the_projector_never_the_decoder(tokenizer):
    llm = decoder(tokenizer, initializer_range=0.5)
    projector, examples, features = trainer_data(tokenizer, llm)
    frozen = {k: v.clone() for k, v in llm.state_dict().items()}
    lora = DecoderLoRA(llm, rank=4)
    trainer = ProjectorTrainer(llm, tokenizer, projector, features, lora=lora)
    before = trainer.loss(examples).item()
    train(trainer, examples, steps=20, batch=len(examples), lr=3e-2, seed=0, log_every=20, lora_lr=1e-2)
    after = trainer.loss(examples).item()
    assert after < 0.8 * before, (before, after)
    assert all(b.abs().sum() > 0 for b in lora.B.values()), "every adapter must have learned"
    assert all(torch.equal(v, llm.state_dict()[k]) for k, v in frozen.items()), "the decoder's own weights stay frozen"


def test_a_widened_adapter_computes_what_the_narrow_one_did_and_carries_its_weights(tokenizer):
    llm = decoder(tokenizer)
    ids = torch.tensor([[5, 9, 3, 7, 11, 2]])
    narrow = randomised(DecoderLoRA(llm, rank=4, alpha=8.0))
    handles = narrow.attach(llm)
    expected = llm(ids).logits
    for h in handles:
        h.remove()
    wide = narrow.widened(llm, ("k_proj", "o_proj", "q_proj"))
    assert wide.targets == ("q_proj", "v_proj", "k_proj", "o_proj") and (wide.rank, wide.alpha) == (4, 8.0)
    handles = wide.attach(llm)
    torch.testing.assert_close(llm(ids).logits, expected, rtol=0, atol=0)
    for h in handles:
        h.remove()
    with torch.no_grad():  # the new projections train: a change to one of them changes the output
        next(b for k, b in wide.B.items() if k.endswith("o_proj")).add_(0.5)
    handles = wide.attach(llm)
    assert not torch.allclose(llm(ids).logits, expected)
    for h in handles:
        h.remove()


def test_a_narrower_saved_adapter_loads_into_a_wider_one_and_nothing_else_does(tokenizer):
    llm = decoder(tokenizer)
    narrow = randomised(DecoderLoRA(llm, rank=4))
    wide = DecoderLoRA(llm, rank=4, targets=("q_proj", "k_proj", "v_proj", "o_proj"))
    wide.load_narrower(narrow.state_dict())
    for key in narrow.A:
        torch.testing.assert_close(wide.B[key], narrow.B[key], rtol=0, atol=0)
    assert all(not b.any() for key, b in wide.B.items() if key.endswith(("k_proj", "o_proj")))
    partial = {k: v for k, v in narrow.state_dict().items() if k != "B.layer0_v_proj"}
    with pytest.raises(ValueError, match="does not fit"):
        wide.load_narrower(partial)
    with pytest.raises(ValueError, match="does not fit"):
        DecoderLoRA(llm, rank=4, targets=("q_proj",)).load_narrower(narrow.state_dict())
