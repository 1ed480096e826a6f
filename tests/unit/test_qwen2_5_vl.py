"""The Qwen2.5-VL adapter: vision path and 3-D positions equal the model's own, mRoPE re-rotation is exact.

References, not the adapter itself: ``Qwen2VLImageProcessorPil`` for the patch
layout, ``Qwen2_5_VLForConditionalGeneration``'s full forward (which places
image features and computes positions with ``get_rope_index``) for the frame
path, and the decoder's own keys at moved positions for the re-rotation.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.cache_utils import DynamicCache
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from tests.unit.helpers import random_frames
from videokv_node.models import ModelLoadError, load_adapter
from videokv_node.models.llava_onevision import LlavaOnevisionAdapter
from videokv_node.models.qwen2_5_vl import IMAGE_MEAN, IMAGE_STD, Qwen25VLAdapter, tiny_qwen25_model


@pytest.fixture(scope="module")
def qwen():
    return Qwen25VLAdapter.tiny(seed=0)


@pytest.fixture(scope="module")
def qwen64():
    """The tiny model in float64 (its own copy: ``.double()`` converts in place)."""
    model, tokenizer = tiny_qwen25_model(seed=0)
    return Qwen25VLAdapter(model.double(), tokenizer, name="tiny64", frame_size=Qwen25VLAdapter.tiny().image_size)


def rgb(n: int, seed: int = 0) -> list[np.ndarray]:
    return [f.rgb for f in random_frames(n, seed=seed)]


# --- vision -------------------------------------------------------------------
def test_encode_frames_shape_and_determinism(qwen):
    frames = rgb(3)
    feats = qwen.encode_frames(frames)
    assert feats.shape == (3, qwen.tokens_per_frame, 64) == (3, 16, 64)
    assert torch.equal(feats, qwen.encode_frames(frames))
    # Frames are independent images: encoding one alone gives its rows of the batch.
    torch.testing.assert_close(qwen.encode_frames(frames[1:2])[0], feats[1], rtol=0, atol=1e-6)
    assert not torch.allclose(feats[0], feats[1])


def test_patches_are_laid_out_as_the_qwen_image_processor_does(qwen):
    """Resized, normalised pixels through the adapter equal the Qwen processor's ``pixel_values``."""
    frames = rgb(2, seed=5)
    mean, std = torch.tensor(IMAGE_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGE_STD).view(1, 3, 1, 1)
    resized = qwen.preprocess(frames) * std + mean  # (F, 3, S, S) in [0, 1], undoing our normalisation
    processor = Qwen2VLImageProcessorPil(patch_size=14, merge_size=2, temporal_patch_size=2)
    expected = processor(
        [x.numpy() for x in resized],
        do_resize=False,
        do_rescale=False,
        do_normalize=True,
        image_mean=list(IMAGE_MEAN),
        image_std=list(IMAGE_STD),
        input_data_format="channels_first",
        return_tensors="pt",
    )
    assert expected["image_grid_thw"].tolist() == [[1, qwen.grid, qwen.grid]] * 2
    torch.testing.assert_close(qwen.patchify(qwen.preprocess(frames)), expected["pixel_values"], rtol=0, atol=1e-5)


# --- positions and the frame path against the model's own forward -------------
def layout(adapter, parts: list[list[int] | int]) -> tuple[torch.Tensor, list[int]]:
    """Positions of ``parts`` (a token id list, or a frame index) laid out from 0, and the
    matching input_ids with ``tokens_per_frame`` image pad tokens per frame."""
    pad = adapter.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    positions, ids, start = [], [], 0
    for part in parts:
        if isinstance(part, int):
            positions.append(adapter.frame_positions(start))
            ids += [pad] * adapter.tokens_per_frame
            start += adapter.frame_span
        else:
            positions.append(adapter.text_positions(start, len(part)))
            ids += part
            start += len(part)
    return torch.cat(positions, dim=1), ids  # (3, N)


def test_forward_over_frames_equals_the_models_own_forward(qwen64):
    """[prefix, frame, markers, frame, question] through the adapter (frames encoded alone, placed at
    ``frame_positions``) gives the logits of the full model fed image pads + pixels: same vision
    features in the same places, same 3-D positions as ``get_rope_index``."""
    a = qwen64
    reference, _ = tiny_qwen25_model(seed=0)  # own copy, stock sdpa attention
    reference = reference.double().eval()
    frames = rgb(2, seed=1)
    between = a.tokenizer.encode("<|vision_end|><|vision_start|>", add_special_tokens=False)
    parts = [a.prefix_ids(), 0, between, 1, a.question_ids("what moved?", ["left", "right"])]
    positions, ids = layout(a, parts)
    input_ids = torch.tensor([ids])
    image_mask = (input_ids == a.tokenizer.convert_tokens_to_ids("<|image_pad|>")).int()
    grid_thw = torch.tensor([[1, a.grid, a.grid]] * 2)
    pixel_values = a.patchify(a.preprocess(frames)).double()

    expected_positions, _ = reference.model.get_rope_index(input_ids, image_mask, image_grid_thw=grid_thw)
    assert torch.equal(positions, expected_positions[:, 0])
    assert not torch.equal(positions[0], positions[1])  # really 3-D: frames have unequal rows

    with torch.inference_mode():
        out = reference(
            input_ids=input_ids, pixel_values=pixel_values, image_grid_thw=grid_thw, mm_token_type_ids=image_mask
        )
    feats = a.encode_frames(frames)  # (2, T, hidden)
    embeds = torch.cat(
        [a.embed_tokens(parts[0]), feats[:1], a.embed_tokens(between), feats[1:], a.embed_tokens(parts[4])], dim=1
    )  # (1, N, hidden)
    logits = a.forward(embeds, positions, DynamicCache())
    assert logits.dtype == torch.float64
    torch.testing.assert_close(logits, out.logits[0, -1], rtol=0, atol=1e-9)


def test_forward_in_pieces_equals_one_forward(qwen64):
    """Appending to the cache piece by piece (as the engine ingests frames) changes nothing."""
    a = qwen64
    feats = a.encode_frames(rgb(2, seed=2))
    q = a.question_ids("what?", [])
    positions, _ = layout(a, [a.prefix_ids(), 0, 1, q])
    embeds = torch.cat([a.embed_tokens(a.prefix_ids()), feats.reshape(1, -1, 64), a.embed_tokens(q)], dim=1)
    whole = a.forward(embeds, positions, DynamicCache())
    n_prefix = len(a.prefix_ids())
    cache, cuts = DynamicCache(), [0, n_prefix, n_prefix + 16, n_prefix + 32, embeds.shape[1]]
    for lo, hi in zip(cuts[:-2], cuts[1:-1]):
        assert a.forward(embeds[:, lo:hi], positions[:, lo:hi], cache, logits=False) is None
    last = a.forward(embeds[:, cuts[-2] :], positions[0, cuts[-2] :], cache)  # text: (n,) positions stand for equal rows
    torch.testing.assert_close(last, whole, rtol=0, atol=1e-9)


# --- exact mRoPE re-rotation ------------------------------------------------------
def float64_rotary(rotary):
    """The decoder's rotary embedding with angles in float64.

    transformers computes mRoPE angles and their cos/sin in float32 even for a
    float64 model, which alone puts ~1e-6 between a key made at p + d and one made
    at p and rotated by d. This keeps everything else of the model's own rotary
    (its inv_freq and its ``recomposition_frequencies``, the t/h/w frequency split
    under test), so a 1e-9 tolerance tests the rotation and not float32 rounding.
    """

    def forward(x, position_ids):
        freqs = position_ids.expand(3, -1, -1)[..., None].double() * rotary.inv_freq.double()  # (3, B, n, D/2)
        cos = rotary.recomposition_frequencies(freqs.cos() * rotary.attention_scaling)  # (B, n, D)
        sin = rotary.recomposition_frequencies(freqs.sin() * rotary.attention_scaling)
        return cos.to(x.dtype), sin.to(x.dtype)

    return forward


def keys_at(adapter, embeds: torch.Tensor, positions: torch.Tensor) -> list[torch.Tensor]:
    """Per layer, the (1, H_kv, n, D) keys the decoder caches for ``embeds`` at ``positions``."""
    cache = DynamicCache()
    adapter.forward(embeds, positions, cache, logits=False)
    return [layer.keys for layer in cache.layers]


@pytest.mark.parametrize("exact_angles", [True, False], ids=["float64-angles", "model-angles"])
def test_rotated_keys_equal_keys_computed_at_moved_positions(qwen64, monkeypatch, exact_angles):
    a = qwen64
    atol = 1e-9 if exact_angles else 5e-6  # float32 angles at positions < 200 leave ~5e-7 (see float64_rotary)
    if exact_angles:
        monkeypatch.setattr(a._lm.rotary_emb, "forward", float64_rotary(a._lm.rotary_emb))
    g = torch.Generator().manual_seed(0)
    n = 24
    embeds = torch.randn(1, n, 64, generator=g, dtype=torch.float64)
    p = torch.randint(0, 60, (3, n), generator=g)  # arbitrary 3-D positions, rows unequal
    base = keys_at(a, embeds, p)

    # One shift of every row of every token: relative positions, hence every layer's input, are unchanged.
    d = 37
    moved = keys_at(a, embeds, p + d)
    for k0, k1 in zip(base, moved):
        torch.testing.assert_close(a.rotate_keys(k0, torch.full((n,), d)), k1, rtol=0, atol=atol)
        torch.testing.assert_close(a.rotate_keys(k0, torch.full((3, n), d)), k1, rtol=0, atol=atol)

    # Independent deltas per row and token: only layer 0 sees the same input at both positions
    # (deeper layers attend with other relative positions), so its keys are the exact reference.
    delta3 = torch.randint(-40, 100, (3, n), generator=g)
    moved = keys_at(a, embeds, p + delta3)
    torch.testing.assert_close(a.rotate_keys(base[0], delta3), moved[0], rtol=0, atol=atol)
    with pytest.raises(AssertionError):  # the per-row split matters: rotating all rows by the t-row delta is wrong
        torch.testing.assert_close(a.rotate_keys(base[0], delta3[0]), moved[0], rtol=0, atol=1e-3)


# --- pack -----------------------------------------------------------------------
def stored_stream(adapter, n_text: int, n_frames: int) -> list[torch.Tensor]:
    """A fresh memory's pieces: ``n_text`` prefix tokens, then ``n_frames`` frames, positions from 0."""
    pieces = [adapter.text_positions(0, n_text)]
    start = n_text
    for _ in range(n_frames):
        pieces.append(adapter.frame_positions(start))
        start += adapter.frame_span
    return pieces


def test_pack_of_a_fresh_layout_is_the_identity(qwen):
    pieces = stored_stream(qwen, 7, 3)
    packed, end = qwen.pack(pieces, 0)
    assert all(torch.equal(x, y) for x, y in zip(packed, pieces))
    assert end == 7 + 3 * qwen.frame_span
    moved, end2 = qwen.pack(pieces, 100)
    assert all(torch.equal(x, y + 100) for x, y in zip(moved, pieces)) and end2 == end + 100


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    n_text=st.integers(1, 6),
    keep=st.lists(st.lists(st.booleans(), min_size=16, max_size=16), min_size=1, max_size=5),
    text_keep=st.lists(st.booleans(), min_size=6, max_size=6),
    start=st.integers(0, 500),
)
def test_pack_moves_pieces_rigidly_and_back_to_back(qwen, n_text, keep, text_keep, start):
    """Kept tokens of frames (any subset) and of text: frame pieces shift as a whole, text pieces become
    consecutive, every token moves by one scalar on all rows, and pieces follow each other without gaps."""
    stored = stored_stream(qwen, n_text, len(keep))
    text_mask = torch.tensor(text_keep[:n_text])
    pieces = [stored[0][:, text_mask]] + [frame[:, torch.tensor(mask)] for frame, mask in zip(stored[1:], keep)]
    pieces = [p for p in pieces if p.shape[1] > 0]
    packed, end = qwen.pack(pieces, start)
    cursor = start
    for old, new in zip(pieces, packed):
        delta = new - old  # (3, t)
        assert torch.equal(delta, delta[:1].expand_as(delta))  # uniform across rows: rotate_keys is exact
        assert int(new.min()) == cursor  # no gap, no overlap with the previous piece
        if torch.equal(old, old[:1].expand_as(old)):  # text
            assert torch.equal(new[0], torch.arange(cursor, cursor + old.shape[1]))
        else:  # (part of) a frame: one shift for the whole piece, grid kept
            assert torch.equal(delta, delta[:1, :1].expand_as(delta))
        cursor = int(new.max()) + 1
    assert end == cursor


# --- factory --------------------------------------------------------------------
def test_factory_selects_the_adapter_by_name(qwen):
    a = load_adapter("tiny-qwen2.5-vl", device="cpu")
    assert isinstance(a, Qwen25VLAdapter) and a.position_dims == 3
    assert a.fingerprint() == qwen.fingerprint()
    assert load_adapter("tiny-qwen2.5-vl", device="cpu", seed=1).fingerprint() != qwen.fingerprint()
    assert isinstance(load_adapter("tiny", device="cpu"), LlavaOnevisionAdapter)


def test_factory_selects_the_adapter_by_checkpoint(qwen, tmp_path):
    qwen.model.save_pretrained(tmp_path)
    qwen.tokenizer.save_pretrained(tmp_path)
    preprocessor = {"image_mean": list(IMAGE_MEAN), "image_std": list(IMAGE_STD)}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    loaded = load_adapter(str(tmp_path), device="cpu", dtype="float32")
    assert isinstance(loaded, Qwen25VLAdapter)
    assert loaded.name == str(tmp_path) and loaded.geometry == qwen.geometry
    assert loaded.tokens_per_frame == 196  # the default 392 px frames: the tower runs at any multiple of 28 px
    assert loaded.encode_frames(rgb(1)).shape == (1, 196, 64)
    # At the tiny's frame size the loaded checkpoint is the same model, computation for computation.
    same = Qwen25VLAdapter.from_pretrained(tmp_path, "cpu", torch.float32, frame_size=qwen.image_size)
    assert same.fingerprint() == qwen.fingerprint()
    assert same.prefix_ids() == qwen.prefix_ids() and same.eos_token_ids == qwen.eos_token_ids
    frames = rgb(2, seed=4)
    torch.testing.assert_close(same.encode_frames(frames), qwen.encode_frames(frames), rtol=0, atol=1e-6)
    embeds = qwen.embed_tokens(qwen.question_ids("what?", []))
    positions = qwen.text_positions(3, embeds.shape[1])
    torch.testing.assert_close(
        same.forward(embeds, positions, DynamicCache()), qwen.forward(embeds, positions, DynamicCache()), rtol=0, atol=1e-6
    )


def test_factory_rejects_an_unsupported_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ModelLoadError, match="'bert'.*llava_onevision, qwen2_5_vl"):
        load_adapter(str(tmp_path), device="cpu")


def test_frame_size_must_fit_the_patch_grid():
    model, tokenizer = tiny_qwen25_model(seed=0)
    with pytest.raises(ValueError, match="multiple of patch x merge = 28"):
        Qwen25VLAdapter(model, tokenizer, name="bad", frame_size=100)
