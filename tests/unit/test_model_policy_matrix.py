"""Every documented model with every policy and question stage runs, or is refused with the reason.

The node builds its engine exactly so (``VideoMemoryEngine(adapter, MemoryConfig(...))``); a
policy default the model cannot take (MuKV's patch split on videokv-tiny's 6 tokens a frame)
is adapted and said, a value set that cannot hold is a ConfigError naming what would.
"""

from __future__ import annotations

import numpy as np
import pytest

from videokv_node.memory import Frame, GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.memory.config import POLICIES, QUESTION_STAGES, ConfigError, MuKVConfig
from videokv_node.models.factory import load_adapter

# The documented model names (docs/MODELS.md, parameter `model`) that need no files beyond installed wheels.
MODELS = ("tiny", "tiny-qwen2.5-vl", "videokv-tiny-random", "videokv-tiny")


@pytest.fixture(scope="module", params=MODELS)
def adapter(request):
    return load_adapter(request.param, device="cpu", dtype="auto", seed=0)


@pytest.mark.parametrize("stage", QUESTION_STAGES)
@pytest.mark.parametrize("policy", POLICIES)
def test_every_model_runs_every_policy_with_its_defaults(adapter, policy, stage):
    engine = VideoMemoryEngine(adapter, MemoryConfig(policy=policy, question_stage=stage), GenerationConfig(max_new_tokens=2))
    rng = np.random.default_rng(0)
    for i in range(3):
        engine.ingest([Frame("cam", i * 10**9, rng.integers(0, 256, (40, 56, 3), dtype=np.uint8))])
    assert engine.stats().frames_ingested == 3
    assert isinstance(engine.ask(Question("What is there?", max_new_tokens=2)).text, str)
    choice = engine.ask(Question("Which?", options=["red", "blue"]))
    assert choice.option_index in (0, 1) and abs(sum(choice.option_scores) - 1) < 1e-4
    T = adapter.tokens_per_frame
    expected = []
    if T > 12:  # the window's default is 8 frames of videokv-tiny's 12 tokens (96): larger frames get 8 of their own
        assert engine.config.local_window_tokens == 8 * T
        expected.append(f"memory.local_window_tokens: the default 96 is 8 frames of videokv-tiny; this model's frames "
                        f"are {T} tokens: using {8 * T} (8 frames)")
    else:
        assert engine.config.local_window_tokens == 96
    if policy == "mukv" and T % MuKVConfig().patch_split:
        split = engine.config.mukv.patch_split
        assert T % split == 0 and split == max(d for d in range(1, 5) if T % d == 0)
        expected.append(f"memory.mukv.patch_split: the default 4 does not divide the {T} tokens of a frame of this model; "
                        f"using {split} (patch blocks of {T // split} tokens)")
    assert engine.adaptations == expected


def test_a_window_set_away_from_its_default_is_kept_whatever_the_model():
    from videokv_node.memory.records.model_fit import fit_to_model

    for T in (6, 12, 196):
        fitted, notes = fit_to_model(MemoryConfig(local_window_tokens=100), T)
        assert fitted.local_window_tokens == 100 and notes == []
    fitted, notes = fit_to_model(MemoryConfig(), 196)  # LLaVA-OneVision's frames: the default holds none of them
    assert fitted.local_window_tokens == 1568 and len(notes) == 1
    assert fit_to_model(MemoryConfig(), 12) == (MemoryConfig(), [])  # videokv-tiny: the default as it is


def test_a_set_patch_split_the_model_cannot_take_is_refused_with_the_choices():
    adapter = load_adapter("videokv-tiny-random", device="cpu", dtype="auto", seed=0)
    with pytest.raises(ConfigError, match=r"memory.mukv.patch_split \(5\) must divide the 6 tokens .*one of \[1, 2, 3, 6\]"):
        VideoMemoryEngine(adapter, MemoryConfig(policy="mukv", mukv=MuKVConfig(patch_split=5)), GenerationConfig())
