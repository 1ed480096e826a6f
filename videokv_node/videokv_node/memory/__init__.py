"""The memory engine: frame blocks, their two tiers, the policies that manage them."""

from videokv_node.memory.config import ConfigError, GenerationConfig, MemoryConfig
from videokv_node.memory.engine import VideoMemoryEngine
from videokv_node.memory.question import Answer, Continuations, Evidence, Frame, Question, RequestError
from videokv_node.memory.stats import EngineStats

__all__ = [
    "Answer",
    "ConfigError",
    "Continuations",
    "EngineStats",
    "Evidence",
    "Frame",
    "GenerationConfig",
    "MemoryConfig",
    "Question",
    "RequestError",
    "VideoMemoryEngine",
]
