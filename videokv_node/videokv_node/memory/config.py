"""Validated configuration of the memory engine.

The ROS parameters map onto these dataclasses in one place
(``videokv_node.ros.params``); the library never reads ROS parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("full", "rekv")


class ConfigError(ValueError):
    """A configuration that cannot work; the message says which field and why."""


@dataclass(slots=True)
class MemoryConfig:
    policy: str = "rekv"  # one of POLICIES; chosen at start, never changed at run time
    budget_tokens: int = 16384  # cap on KV tokens resident on the model's device, prompt sink included
    offload_bytes: int = 1 << 30  # cap on host RAM for offloaded KV blocks, allocated once at start
    local_window_tokens: int = 2048  # tokens of recent frames each new frame attends to while encoding
    retrieve_frames: int = 8  # frame blocks retrieved per layer for a question (besides the recent ones)
    page_tokens: int = 4  # host arena allocation unit, in tokens: divides 196 (LLaVA-OV) and 16 (tiny) exactly
    max_question_tokens: int = 512  # longer questions are refused

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"memory.policy must be one of {POLICIES}, got {self.policy!r}")
        for name in ("budget_tokens", "local_window_tokens", "page_tokens", "max_question_tokens"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"memory.{name} must be > 0, got {getattr(self, name)}")
        if self.offload_bytes < 0:
            raise ConfigError(f"memory.offload_bytes must be >= 0, got {self.offload_bytes}")
        if self.retrieve_frames < 0:
            raise ConfigError(f"memory.retrieve_frames must be >= 0, got {self.retrieve_frames}")
        if self.local_window_tokens >= self.budget_tokens:
            raise ConfigError(
                f"memory.local_window_tokens ({self.local_window_tokens}) must be smaller than "
                f"memory.budget_tokens ({self.budget_tokens}): the window is part of the resident budget"
            )


@dataclass(slots=True)
class GenerationConfig:
    max_new_tokens: int = 64  # default answer length when a request gives 0
    max_new_tokens_limit: int = 1024  # a request asking for more is refused

    def __post_init__(self) -> None:
        if not 0 < self.max_new_tokens <= self.max_new_tokens_limit:
            raise ConfigError(
                f"max_new_tokens must be in [1, {self.max_new_tokens_limit}], got {self.max_new_tokens}"
            )
