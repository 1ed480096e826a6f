"""Real photos in videokv-tiny's training data (tinyvlm.scenes.PHOTOS): crops, questions, no cell words."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaForCausalLM

from videokv_node.models.tiny_tokenizer import build_tiny_tokenizer
from videokv_node.tinyvlm.scenes import (
    PHOTO_BY_FILE, PHOTOS, Scene, SceneSampler, caption, cell_words, normalise_answer, photo_dir,
)
from videokv_node.tinyvlm.align import cell_targets
from videokv_node.tinyvlm.dataset import build_examples
from videokv_node.tinyvlm.render import render
from videokv_node.tinyvlm.trainer import ProjectorTrainer
from videokv_node.models.videokv_tiny import Projector, tiny_llama_config


def photos_installed() -> bool:
    try:
        photo_dir()
    except FileNotFoundError:
        return False
    return True


needs_photos = pytest.mark.skipif(not photos_installed(), reason="scikit-image (its wheel ships the photos) not installed")


@needs_photos
def test_every_photo_is_shipped():
    for photo in PHOTOS:
        assert (photo_dir() / photo.file).is_file(), photo.file


@needs_photos
def test_a_crop_is_a_224px_rgb_frame_fixed_by_its_seed():
    a, b, c = (render(Scene(photo="chelsea.png", seed=s)) for s in (1, 1, 2))
    assert a.shape == (224, 224, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    gray = render(Scene(photo="camera.png", seed=1))  # a grayscale photo still gives 3 channels
    assert gray.shape == (224, 224, 3) and np.array_equal(gray[..., 0], gray[..., 1])


def test_photo_questions_are_answered_from_what_the_photo_shows():
    sampler = SceneSampler(7, photo_crops=3)
    seen = set()
    for _ in range(200):
        ex = sampler.photo_question()
        photo = PHOTO_BY_FILE[ex.scenes[0].photo]
        assert ex.kind == "photo" and len(ex.scenes) == 1
        if ex.question in ("Describe the image.", "What is in the image?"):
            assert ex.answer == photo.caption == caption(ex.scenes[0])
        elif ex.question == "How many people are there?":
            assert ex.answer == photo.people
        else:
            assert ex.question == f"What colour is the {photo.colour[0]}?" and ex.answer == photo.colour[1]
        seen.add(ex.scenes[0])
    assert len(seen) <= 3 * len(PHOTOS)  # the sampler's crops only
    assert normalise_answer("A cup of coffee.") == "cup of coffee"


def test_adding_photos_keeps_the_rendered_pool():
    """Photos are drawn after the pool, so a feature cache of the rendered scenes stays valid."""
    plain = build_examples(seed=2, n_frame=6, n_stream=2, pool=30, max_stream=3)
    mixed = build_examples(seed=2, n_frame=6, n_stream=2, pool=30, max_stream=3, n_photo=4, photo_crops=2)
    assert {ex.scenes for ex in plain} <= {ex.scenes for ex in mixed}
    assert sum(ex.kind == "photo" for ex in mixed) == 4


def test_the_alignment_leash_holds_only_rendered_frames():
    """Photos have no cell words: a photo-only batch's loss is its answer loss whatever the weight."""
    tokenizer = build_tiny_tokenizer()
    torch.manual_seed(0)
    llm = LlamaForCausalLM(tiny_llama_config(tokenizer)).eval()
    projector = Projector(llm.config.hidden_size, mlp_dim=32)
    examples = build_examples(seed=4, n_frame=2, n_stream=0, pool=12, max_stream=2, n_photo=3, photo_crops=2)
    gen = torch.Generator().manual_seed(1)
    scenes = sorted({s for ex in examples for s in ex.scenes}, key=lambda s: (s.photo or "", s.seed))
    features = {s: torch.rand(*projector.pooled_shape, generator=gen) for s in scenes}
    targets, _ = cell_targets(features, tokenizer, llm.get_input_embeddings())
    assert set(targets) == {s for s in scenes if s.photo is None}
    assert all(cell_words(s) is None for s in scenes if s.photo is not None)
    photos = [ex for ex in examples if ex.kind == "photo"]
    plain = ProjectorTrainer(llm, tokenizer, projector, features).loss(photos)
    leashed = ProjectorTrainer(llm, tokenizer, projector, features, align_weight=3.0).loss(photos)
    torch.testing.assert_close(leashed, plain)
    rendered = [ex for ex in examples if ex.kind != "photo"]
    assert ProjectorTrainer(llm, tokenizer, projector, features, align_weight=3.0).loss(rendered) > \
        ProjectorTrainer(llm, tokenizer, projector, features).loss(rendered)


@needs_photos
def test_colour_questions_are_asked_only_of_colour_photos():
    """A grayscale photo cannot show what colour a thing is (grass.png is grayscale: no grass colour)."""
    from PIL import Image

    for photo in PHOTOS:
        rgb = np.asarray(Image.open(photo_dir() / photo.file).convert("RGB")).astype(int)
        grey = np.abs(rgb[..., 0] - rgb[..., 1]).max() < 3 and np.abs(rgb[..., 1] - rgb[..., 2]).max() < 3
        assert not (grey and photo.colour), photo.file
