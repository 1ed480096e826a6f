"""docs/ARCHITECTURE.md's minimal policy, built from the guide's own code block and run through the engine on the
tiny random-weight model (issue 45): the guide cannot drift from what the code takes.

The block is written where the guide says (``memory/policies/newest.py``, here a module object under that name)
and declared as the guide says (``declare_policy("newest")``, undone after the test). With a window and a budget
that hold the whole stream it attends to what ``full`` attends to, so its first answer logits equal ``full``'s
(which equal a plain forward: test_engine_parity.py); with a smaller budget it stays within it.
"""

from __future__ import annotations

import re
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch

from tests.unit.helpers import random_frames
from videokv_node.memory import GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.memory.config import POLICIES, POLICY_CONFIGS, declare_policy

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "ARCHITECTURE.md"


def guide_block() -> str:
    """The python block between the guide's minimal-policy markers, unindented."""
    text = GUIDE.read_text()
    inside = text.split("<!-- minimal-policy:begin -->")[1].split("<!-- minimal-policy:end -->")[0]
    code = re.search(r"```python\n(.*?)```", inside, re.DOTALL)
    assert code, "docs/ARCHITECTURE.md: no python block between the minimal-policy markers"
    return textwrap.dedent(code.group(1))


@pytest.fixture
def newest(monkeypatch):
    """The guide's policy, in memory/policies/newest.py's place, declared for the test's length only."""
    name = "videokv_node.memory.policies.newest"
    module = types.ModuleType(name)
    exec(compile(guide_block(), "docs/ARCHITECTURE.md (minimal policy)", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, name, module)
    declare_policy("newest")  # as the guide says, in memory/config.py
    yield module.NewestPolicy
    del POLICY_CONFIGS["newest"]


def engine(adapter, policy: str, frames: int, window: int) -> VideoMemoryEngine:
    """A budget of ``frames`` frames after the sink, a window of ``window`` frames."""
    T, sink = adapter.tokens_per_frame, len(adapter.prefix_ids())
    cfg = MemoryConfig(policy=policy, budget_tokens=sink + frames * T, local_window_tokens=window * T, page_tokens=4)
    return VideoMemoryEngine(adapter, cfg, GenerationConfig(max_new_tokens=2, max_new_tokens_limit=4))


def test_the_guides_minimal_policy_runs_through_the_engine(tiny_adapter, newest):
    stream = random_frames(5, seed=11)
    e, full = engine(tiny_adapter, "newest", 9, 8), engine(tiny_adapter, "full", 9, 8)
    assert type(e.policy) is newest and e.policy.name == "newest"
    for f in stream:
        e.ingest([f])
        full.ingest([f])
    question = Question("what is there?", max_new_tokens=1)
    answer = e.ask(question)
    full.ask(question)
    assert [ev.stamp_ns for ev in answer.evidence] == [f.stamp_ns for f in stream]
    torch.testing.assert_close(e.last_logits, full.last_logits)
    small = engine(tiny_adapter, "newest", 3, 1)  # 3 frames' budget: the caps evict the oldest
    for f in stream:
        small.ingest([f])
    stats = small.stats()
    assert stats.frames_evicted == 2 and stats.frames_in_memory == 3 and stats.tokens_resident <= stats.budget_tokens
    for x in (e, full, small):
        x.close()


def test_the_declaration_is_undone():
    assert "newest" not in POLICY_CONFIGS and "newest" not in POLICIES
