"""The evaluation targets (engine, ROS, text) implement the declared protocol of eval/target.py.

Checked on the classes, independently of any model: every member the protocol declares is defined
by the target itself (a method taking as many arguments as the protocol's, an attribute declared on
the class), so a target that drifts from the protocol fails here rather than half-way through a run.
"""

from __future__ import annotations

import inspect
from typing import Protocol

import pytest

from videokv_node.eval.replay import EngineTarget
from videokv_node.eval.target import BagTarget, EvalTarget
from videokv_node.eval.text_stream import TextTarget
from videokv_node.programs.replay_target import RosTarget  # imports rclpy only when a RosTarget is made


def protocol_members(protocol) -> dict[str, object]:
    """Name -> the protocol's function (methods) or None (attributes), over the protocol's own bases."""
    members = {}
    for base in reversed(protocol.__mro__):
        if base in (object, Protocol) or not getattr(base, "_is_protocol", False):
            continue
        members.update({name: None for name in base.__dict__.get("__annotations__", {})})
        members.update({name: fn for name, fn in vars(base).items() if inspect.isfunction(fn) and not name.startswith("_")})
    return members


def missing(cls, protocol) -> list[str]:
    """What ``cls`` lacks or spells differently, as readable lines (empty: it implements the protocol)."""
    out = []
    for name, fn in protocol_members(protocol).items():
        own = next((vars(c)[name] for c in cls.__mro__ if name in vars(c)), None)
        declared = any(name in c.__dict__.get("__annotations__", {}) for c in cls.__mro__)
        if fn is None:
            if own is None and not declared:
                out.append(f"attribute {name}")
            continue
        if not inspect.isfunction(own):
            out.append(f"method {name}")
            continue
        want = list(inspect.signature(fn).parameters)[1:]
        have = [n for n, p in list(inspect.signature(own).parameters.items())[1:] if p.default is inspect.Parameter.empty]
        if len(have) != len(want):  # called positionally: the count matters, not the names
            out.append(f"method {name}{tuple(have)}, the protocol's takes {tuple(want)}")
    return out


def test_the_check_finds_a_target_that_drifted():
    class Drifted:
        via = "engine"

        def offer(self, frame) -> None: ...
        def settle(self) -> None: ...
        def ask(self, question, extra) -> None: ...
        def close(self) -> None: ...

    assert set(protocol_members(BagTarget)) == {"via", "counts", "offer", "settle", "ask", "memory", "close", "relay",
                                                "report"}
    assert missing(Drifted, BagTarget) == ["method ask('question', 'extra'), the protocol's takes ('q',)",
                                           "method memory", "attribute counts", "method relay", "method report"]


@pytest.mark.parametrize("target, protocol", [(EngineTarget, BagTarget), (RosTarget, BagTarget), (TextTarget, EvalTarget)],
                         ids=["engine", "ros", "text"])
def test_every_target_implements_its_protocol(target, protocol):
    assert missing(target, protocol) == []
