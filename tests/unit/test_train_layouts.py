"""videokv-tiny's training layouts (``tinyvlm.trainer.layout_mask``): one masked forward must compute
exactly what the memory engine computes when it encodes a stream frame by frame in a sliding window
and then asks a question over some of the frames."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM
from transformers.cache_utils import DynamicCache

from tests.unit.helpers import random_features
from videokv_node.models.tiny_tokenizer import build_tiny_tokenizer
from videokv_node.tinyvlm.scenes import Example
from videokv_node.tinyvlm.dataset import build_examples
from videokv_node.tinyvlm.trainer import ProjectorTrainer, layout_mask
from videokv_node.models.videokv_tiny import Projector, tiny_llama_config


def test_layout_mask_of_a_small_sequence():
    """1 lead-in frame, 2 frames of 2 tokens, 2 text tokens, 1 padding; prefix of 1 token; window 0 and 1."""
    isolated = [  # prefix | L L F F G G t t pad
        [1, 1, 0, 0, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0, 0, 0],
        [1, 0, 0, 1, 0, 0, 0, 0, 0, 0],
        [1, 0, 0, 1, 1, 0, 0, 0, 0, 0],
        [1, 0, 0, 0, 0, 1, 0, 0, 0, 0],
        [1, 0, 0, 0, 0, 1, 1, 0, 0, 0],
        [1, 0, 0, 1, 1, 1, 1, 1, 0, 0],  # the question sees the frames, not the lead-in
        [1, 0, 0, 1, 1, 1, 1, 1, 1, 0],
        [1, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # padding: the prefix alone
    ]
    assert layout_mask(1, 2, 2, 2, 0, 1, 9).int().tolist() == isolated
    one_back = [row[:] for row in isolated]
    one_back[2][1:3] = one_back[3][1:3] = [1, 1]  # the first frame sees the lead-in
    one_back[4][3:5] = one_back[5][3:5] = [1, 1]  # the second sees the first, not the lead-in
    assert layout_mask(1, 2, 2, 2, 1, 1, 9).int().tolist() == one_back


@pytest.mark.parametrize("n_lead", [0, 2])
def test_without_window_and_lead_ins_the_mask_is_causal(n_lead):
    mask = layout_mask(n_lead, 3, 2, 4, None, 3, 6 * (n_lead + 3))
    body = mask[:, 3:]
    if n_lead == 0:
        n = 3 * 2 + 4
        assert torch.equal(body[:n, :n], torch.tril(torch.ones(n, n, dtype=torch.bool)))
    else:  # frames see the lead-ins; the text does not
        assert bool(body[2 * 2, : 2 * 2].all()) and not bool(body[5 * 2, : 2 * 2].any())


def kv_of(cache: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def cache_of(parts: list[list[tuple[torch.Tensor, torch.Tensor]]]) -> DynamicCache:
    """A cache holding the given KV parts, concatenated in order along the sequence, per layer."""
    cache = DynamicCache()
    for layer in range(len(parts[0])):
        cache.update(torch.cat([p[layer][0] for p in parts], 2), torch.cat([p[layer][1] for p in parts], 2), layer)
    return cache


def engine_loss(trainer: ProjectorTrainer, example: Example, leads: list, window: int) -> torch.Tensor:
    """The answer loss as the memory engine computes it: the prefix encoded once; each frame (lead-ins
    first) encoded after the prefix and the KV of the ``window`` frames before it, which were encoded
    the same way; the question after the prefix and the example's frames only. Positions back to back."""
    llm, P = trainer.llm, len(trainer.prefix)
    prefix = DynamicCache()
    llm.model(input_ids=torch.tensor([trainer.prefix]), past_key_values=prefix, use_cache=True)
    prefix_kv = kv_of(prefix)
    frames = leads + list(example.scenes)
    tokens = trainer.projector.project(torch.stack([trainer.features[s] for s in frames]))  # (F, T, hidden)
    T, kvs = tokens.shape[1], []
    for f in range(len(frames)):
        context = kvs[max(0, f - window) : f]
        cache = cache_of([prefix_kv, *context])
        pos = torch.arange(P + f * T, P + (f + 1) * T)[None]
        llm.model(inputs_embeds=tokens[f][None], position_ids=pos, past_key_values=cache, use_cache=True)
        kvs.append([(k[:, :, -T:], v[:, :, -T:]) for k, v in kv_of(cache)])
    q = trainer.question_ids(example.question)
    a = trainer._ids(example.answer) + [trainer.end_id]
    text = trainer.embed(torch.tensor(q + a[:-1]))[None]
    start = P + len(frames) * T
    cache = cache_of([prefix_kv, *kvs[len(leads) :]])
    out = llm.model(inputs_embeds=text, position_ids=torch.arange(start, start + text.shape[1])[None],
                    past_key_values=cache, use_cache=True)
    hidden = out.last_hidden_state[0, len(q) - 1 :]
    return F.cross_entropy(llm.lm_head(hidden).float(), torch.tensor(a))


@pytest.mark.parametrize("n_lead, window", [(0, 0), (1, 0), (2, 1), (1, 5)])
def test_masked_forward_equals_frame_by_frame_encoding(n_lead, window):
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(0)
    llm = LlamaForCausalLM(tiny_llama_config(tokenizer, initializer_range=0.2)).eval()
    projector = Projector(llm.config.hidden_size, mlp_dim=32)
    examples = build_examples(seed=3, n_frame=1, n_stream=4, pool=12, max_stream=3)
    example = max(examples, key=lambda ex: len(ex.scenes))
    assert len(example.scenes) >= 2
    scenes, features = random_features(projector, examples, seed=2)
    leads = [s for s in scenes if s not in example.scenes][:n_lead]
    trainer = ProjectorTrainer(llm, tokenizer, projector, features, window_share=1.0, max_lead=n_lead)
    trainer._layout = lambda n_frames: (list(leads), window)  # the layout under test, not a drawn one
    with torch.no_grad():
        masked = trainer.loss([example])
        reference = engine_loss(trainer, example, leads, window)
        joint = ProjectorTrainer(llm, tokenizer, projector, features).loss([example])
    torch.testing.assert_close(masked, reference, rtol=1e-5, atol=1e-5)
    if n_lead or window < len(example.scenes) - 1:  # the layout changes what the frames attend to
        assert not torch.allclose(masked, joint, rtol=1e-4, atol=1e-4)


def test_encoding_layouts_are_seeded_and_off_by_default():
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(0)
    llm = LlamaForCausalLM(tiny_llama_config(tokenizer, initializer_range=0.2)).eval()  # not near flat
    projector = Projector(llm.config.hidden_size, mlp_dim=32)
    examples = build_examples(seed=3, n_frame=3, n_stream=3, pool=12, max_stream=3)
    _, features = random_features(projector, examples, seed=0)
    with torch.no_grad():
        plain = ProjectorTrainer(llm, tokenizer, projector, features).loss(examples)
        never = ProjectorTrainer(llm, tokenizer, projector, features, window_share=0.0, max_lead=2).loss(examples)
        always = ProjectorTrainer(llm, tokenizer, projector, features, window_share=1.0, max_lead=2, seed=4).loss(examples)
        again = ProjectorTrainer(llm, tokenizer, projector, features, window_share=1.0, max_lead=2, seed=4).loss(examples)
    torch.testing.assert_close(never, plain)
    assert not torch.allclose(always, plain, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(again, always)
