"""The interface every memory policy implements, and the factory that picks one.

A policy decides, never stores: which resident blocks a new frame attends to
while it is encoded, which block leaves the device when the resident budget is
exceeded, which offloaded block is dropped when the host arena is full, and
which blocks a question attends to. The engine and the block store do the
moving and the counting, so a policy is a small class (see ``policies/``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

from videokv_node.memory.block import FrameBlock, Tier
from videokv_node.memory.block_store import BlockStore
from videokv_node.memory.config import MemoryConfig


@dataclass(slots=True)
class QuestionSelection:
    """What a question attends to, per layer: every ``fixed`` block plus the top ``k`` of ``pool``.

    The engine scores ``pool`` separately in each layer (ReKV: the question's mean
    query against each block's mean key) and puts the union in time order.
    Invariant: ``fixed`` and ``pool`` are disjoint.
    """

    fixed: list[FrameBlock] = field(default_factory=list)
    pool: list[FrameBlock] = field(default_factory=list)
    k: int = 0

    @property
    def n_blocks_per_layer(self) -> int:
        return len(self.fixed) + min(self.k, len(self.pool))


class MemoryPolicy(ABC):
    """Base policy: oldest-first demotion and eviction; subclasses say what is attended to."""

    name: ClassVar[str]
    uses_offload: ClassVar[bool]  # False: a block leaving the device is evicted, not offloaded

    def __init__(self, config: MemoryConfig) -> None:
        self.config = config

    @abstractmethod
    def encoding_context(self, store: BlockStore) -> list[FrameBlock]:
        """Resident blocks, in time order, that the next frame attends to (besides the prompt sink)."""

    @abstractmethod
    def question_selection(self, store: BlockStore, candidates: list[FrameBlock]) -> QuestionSelection:
        """Split the question's candidate blocks (time order, already filtered by camera/time) into fixed and pool."""

    def after_ingest(self, store: BlockStore, block: FrameBlock) -> None:
        """Hook for policies that compress or segment right after a frame is encoded; none by default."""

    def demotion_victim(self, store: BlockStore) -> FrameBlock:
        """The resident block to move off the device when over budget: the oldest."""
        victim = store.oldest(Tier.RESIDENT)
        if victim is None:
            raise RuntimeError("over the resident budget with no resident block: the budget is smaller than the sink")
        return victim

    def offload_victim(self, store: BlockStore) -> FrameBlock:
        """The offloaded block to drop when the host arena is full: the oldest."""
        victim = store.oldest(Tier.OFFLOADED)
        if victim is None:
            raise RuntimeError("host arena full with no offloaded block")
        return victim


def recent_within(blocks: list[FrameBlock], max_tokens: int) -> list[FrameBlock]:
    """The longest suffix of ``blocks`` (time order) whose tokens fit in ``max_tokens``."""
    out: list[FrameBlock] = []
    total = 0
    for block in reversed(blocks):
        if total + block.n_tokens > max_tokens:
            break
        out.append(block)
        total += block.n_tokens
    out.reverse()
    return out


def make_policy(config: MemoryConfig) -> MemoryPolicy:
    """The only place a policy name is looked up."""
    from videokv_node.memory.policies import POLICY_CLASSES

    return POLICY_CLASSES[config.policy](config)
