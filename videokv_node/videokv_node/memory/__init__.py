"""The memory engine: frame blocks, their two tiers, the policies that manage them.

The names below are loaded on first use (PEP 562 ``__getattr__``), so importing a light part of
the package (``memory.config``: the policy list and the option scorings that the launch file and
the eval CLI's help read) never loads the engine, torch or transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # what a type checker sees; at run time __getattr__ loads each name where it lives
    from videokv_node.memory.config import ConfigError, GenerationConfig, MemoryConfig
    from videokv_node.memory.engine import VideoMemoryEngine
    from videokv_node.memory.question import Answer, Continuations, Evidence, Frame, Question, RequestError
    from videokv_node.memory.stats import EngineStats

_HOME = {  # public name -> the module of this package that defines it
    "ConfigError": "config", "GenerationConfig": "config", "MemoryConfig": "config",
    "VideoMemoryEngine": "engine",
    "Answer": "question", "Continuations": "question", "Evidence": "question", "Frame": "question",
    "Question": "question", "RequestError": "question",
    "EngineStats": "stats",
}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    """``from videokv_node.memory import VideoMemoryEngine`` and the like: the name, from its module."""
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
