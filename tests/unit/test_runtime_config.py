"""Run-time reconfiguration of the engine (ROS parameters set while the node runs).

A new budget is applied between two frames: a smaller one demotes, compresses or
evicts at once (counted), a larger one takes effect as frames arrive; a refused
config leaves the engine exactly as it was.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.unit.helpers import scene
from tests.unit.test_policy_budgets import check, engine
from videokv_node.ingest.sampler import FrameSampler, SampleDecision, SamplerConfig
from videokv_node.memory import ConfigError, GenerationConfig
from videokv_node.memory.store.block import Tier


def budget(e, frames: int) -> int:
    """budget_tokens holding the sink, the local window, one frame and ``frames`` more."""
    return e.sink.n_tokens + e.config.local_window_tokens + (1 + frames) * e.adapter.tokens_per_frame


def resident_frames(e) -> int:
    return sum(1 for _ in e.store.blocks(Tier.RESIDENT))


def test_rekv_budget_shrinks_and_grows_mid_stream(tiny_adapter):
    # Resident: window 1 + 1 + 4 frames; host arena: 2 frames.
    e = engine(tiny_adapter, "rekv", budget_frames=4, window_frames=1, offload_frames=2)
    frames = scene(15, seed=3)
    for f in frames[:10]:
        e.ingest([f])
    assert (resident_frames(e), e.stats().frames_in_memory, e.stats().frames_evicted) == (6, 8, 2)

    e.reconfigure(replace(e.config, budget_tokens=budget(e, 1)))  # 3 frames resident
    s = e.stats()
    assert s.budget_tokens == e.config.budget_tokens and s.tokens_resident <= s.budget_tokens
    # The 3 oldest resident frames went to the arena, pushing its 2 + 1 oldest out, counted.
    assert (resident_frames(e), s.frames_in_memory, s.frames_evicted) == (3, 5, 5)
    check(e, {})

    e.reconfigure(replace(e.config, budget_tokens=budget(e, 3), retrieve_frames=1))  # 5 frames resident
    assert resident_frames(e) == 3 and e.stats().frames_evicted == 5  # growing moves nothing back
    for f in frames[10:]:
        e.ingest([f])
        check(e, {})
    assert resident_frames(e) == 5 and e.policy.config.retrieve_frames == 1


def test_hermes_budget_shrink_compresses_at_once_and_growth_holds(tiny_adapter):
    e = engine(tiny_adapter, "hermes", budget_frames=6, window_frames=1, offload_frames=0)  # chunk_frames=2
    T, L = tiny_adapter.tokens_per_frame, tiny_adapter.geometry.n_layers
    frames = scene(24, seed=5)
    for f in frames[:12]:
        e.ingest([f])
    compressions, evicted = e.policy.compressions, e.store.evicted_entries
    per_layer = budget(e, 2) - e.sink.n_tokens  # 4 frames per layer
    e.reconfigure(replace(e.config, budget_tokens=budget(e, 2)))
    assert e.policy.budget == per_layer and e.policy.compressions == compressions + 1
    assert e.store.evicted_entries > evicted
    held = [sum(b.layer_tokens(l) for b in e.store.blocks()) for l in range(L)]
    assert max(held) <= per_layer - T  # room left for the rest of a chunk, as after any compression
    check(e, {})

    e.reconfigure(replace(e.config, budget_tokens=budget(e, 6)))
    for f in frames[12:]:
        e.ingest([f])
        check(e, {})
    assert e.stats().budget_tokens == e.config.budget_tokens


@pytest.mark.parametrize("name", ["rekv", "hermes"])
def test_refused_configs_leave_the_engine_unchanged(tiny_adapter, name):
    e = engine(tiny_adapter, name, budget_frames=6, window_frames=1, offload_frames=2)
    for f in scene(10, seed=1):
        e.ingest([f])
    config, generation, stats = e.config, e.generation, e.stats()
    bad = [
        (replace(config, budget_tokens=budget(e, 0) - 1), "must hold the prompt sink"),
        (replace(config, policy="full"), "needs a restart"),
        (replace(config, local_window_tokens=2 * config.local_window_tokens), "needs a restart"),
    ]
    if name == "hermes":  # chunk_frames=2: a layer must keep a frame and the summary token, plus a frame of room
        bad.append((replace(config, budget_tokens=budget(e, 0)), "chunk_frames"))
    for new, reason in bad:
        with pytest.raises(ConfigError, match=reason):
            e.reconfigure(new, GenerationConfig(max_new_tokens=1, max_new_tokens_limit=1))
        assert e.config is config and e.policy.config is config and e.generation is generation
        assert e.stats() == stats


def test_generation_limits_change_with_the_config(tiny_adapter):
    e = engine(tiny_adapter, "rekv", budget_frames=2, window_frames=1, offload_frames=0)
    e.reconfigure(e.config, GenerationConfig(max_new_tokens=1, max_new_tokens_limit=2))
    assert (e.generation.max_new_tokens, e.generation.max_new_tokens_limit) == (1, 2)


def test_sampler_config_swap_applies_from_the_next_frame():
    sampler = FrameSampler(SamplerConfig(sample_fps=1.0))
    s = 1_000_000_000
    assert sampler.offer("cam", 0) is SampleDecision.ACCEPT
    assert sampler.offer("cam", s // 2) is SampleDecision.SKIP
    sampler.set_config(SamplerConfig(sample_fps=4.0))
    assert sampler.offer("cam", 3 * s // 4) is SampleDecision.ACCEPT  # 0.25 s after the last accepted frame
    assert sampler.counters()["cam"].accepted == 2
