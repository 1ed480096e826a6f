"""load_adapter: the tiny model is reproducible, a local checkpoint loads the same model, bad input says why.

The checkpoint path is exercised without any download: the tiny model is saved
with ``save_pretrained`` and loaded back through ``load_adapter(directory)``,
which must give the very same computation.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers.cache_utils import DynamicCache

from tests.unit.helpers import random_frames
from videokv_node.models import ModelLoadError, load_adapter


def save_checkpoint(adapter, directory):
    adapter.model.save_pretrained(directory)
    adapter.tokenizer.save_pretrained(directory)
    (directory / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.5] * 3, "image_std": [0.5] * 3}))
    return directory


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return save_checkpoint(load_adapter("tiny", device="cpu"), tmp_path_factory.mktemp("tiny_ckpt"))


def outputs(adapter):
    """Frame embeddings and the logits of one forward over [prefix, 2 frames, question]."""
    frames = [f.rgb for f in random_frames(2, seed=7)]
    feats = adapter.encode_frames(frames)  # (2, T, hidden)
    parts = [
        adapter.embed_tokens(adapter.prefix_ids()),
        feats.reshape(1, -1, feats.shape[-1]),
        adapter.embed_tokens(adapter.question_ids("what?", [])),
    ]
    embeds = torch.cat(parts, dim=1)  # (1, N, hidden)
    logits = adapter.forward(embeds, torch.arange(embeds.shape[1]), DynamicCache())
    return feats, logits


def test_tiny_is_reproducible():
    a, b = load_adapter("tiny", device="cpu"), load_adapter("tiny", device="cpu")
    assert a.fingerprint() == b.fingerprint()
    for x, y in zip(outputs(a), outputs(b)):
        assert torch.equal(x, y)
    assert load_adapter("tiny", device="cpu", seed=1).fingerprint() != a.fingerprint()


def test_tiny_does_not_touch_the_global_rng():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    load_adapter("tiny", device="cpu")
    assert torch.equal(torch.rand(3), expected)


def test_checkpoint_directory_loads_the_same_model(checkpoint, tiny_adapter):
    loaded = load_adapter(str(checkpoint), device="cpu", dtype="float32")
    assert loaded.name == str(checkpoint)
    assert loaded.device == torch.device("cpu")
    assert loaded.geometry == tiny_adapter.geometry
    assert (loaded.tokens_per_frame, loaded.max_positions, loaded.image_size) == (
        tiny_adapter.tokens_per_frame, tiny_adapter.max_positions, tiny_adapter.image_size,
    )
    assert loaded.prefix_ids() == tiny_adapter.prefix_ids()
    assert loaded.question_ids("what?", ["a", "b"]) == tiny_adapter.question_ids("what?", ["a", "b"])
    assert loaded.option_token_ids(4) == tiny_adapter.option_token_ids(4)
    assert loaded.eos_token_ids == tiny_adapter.eos_token_ids
    for x, y in zip(outputs(loaded), outputs(tiny_adapter)):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-6)


def test_checkpoint_preprocessor_config_is_used(checkpoint, tmp_path):
    """image_mean/std come from preprocessor_config.json: other values give other pixels."""
    other = tmp_path / "ckpt"
    shutil.copytree(checkpoint, other)
    (other / "preprocessor_config.json").write_text(json.dumps({"image_mean": [0.0] * 3, "image_std": [1.0] * 3}))
    frames = [f.rgb for f in random_frames(1, seed=3)]
    a = load_adapter(str(checkpoint), device="cpu", dtype="float32").preprocess(frames)
    b = load_adapter(str(other), device="cpu", dtype="float32").preprocess(frames)
    torch.testing.assert_close(b, (a + 1) / 2, rtol=0, atol=1e-6)  # (x - .5) / .5 vs x


def test_fingerprint_does_not_depend_on_the_directory(checkpoint, tmp_path):
    other = tmp_path / "moved"
    shutil.copytree(checkpoint, other)
    a = load_adapter(str(checkpoint), device="cpu", dtype="float32")
    b = load_adapter(str(other), device="cpu", dtype="float32")
    assert a.fingerprint() == b.fingerprint()


def test_missing_path_says_which():
    with pytest.raises(ModelLoadError, match="/nonexistent"):
        load_adapter("/nonexistent", device="cpu")


def test_directory_without_config_json(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_adapter(str(tmp_path), device="cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda():
    with pytest.raises(ModelLoadError, match="CUDA is not available"):
        load_adapter("tiny", device="cuda:0")


def test_a_cuda_device_becomes_the_current_one_and_a_missing_index_is_refused(monkeypatch):
    """Checked with torch.cuda's answers replaced (no GPU here): cuda:1 of 2 is made current, cuda:2 refused."""
    from videokv_node.models.factory import use_device

    current = []
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda dev: current.append(str(dev)))
    use_device(torch.device("cpu"))
    assert current == []
    use_device(torch.device("cuda:1"))
    assert current == ["cuda:1"]
    with pytest.raises(ModelLoadError, match="'cuda:2' requested but only 2 CUDA device"):
        use_device(torch.device("cuda:2"))
    assert current == ["cuda:1"]


def test_device_that_is_not_a_device():
    with pytest.raises(ModelLoadError, match="not a torch device"):
        load_adapter("tiny", device="gpu-please")


def test_unknown_dtype(checkpoint):
    with pytest.raises(ModelLoadError, match="dtype 'float8' unknown"):
        load_adapter(str(checkpoint), device="cpu", dtype="float8")


def test_unknown_dtype_with_tiny():
    with pytest.raises(ModelLoadError, match="dtype 'float8' unknown"):
        load_adapter("tiny", device="cpu", dtype="float8")
