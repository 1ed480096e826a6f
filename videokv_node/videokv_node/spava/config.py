"""Spava's sizes, validated once; nothing in a forward pass holds a constant of its own."""

from __future__ import annotations

from dataclasses import dataclass

from videokv_node.config_base import ConfigError, param


class SpavaConfigError(ConfigError):
    """A Spava setting that cannot work, with the field named."""


@dataclass(frozen=True, slots=True)
class SpavaConfig:
    """Sizes of Spava's approximate attention (paper sections 3.2-3.3, 4.3-4.4).

    The paper ties both lengths to the input (section 5.4: anchor 256 and
    passing 512 tokens in its VNBench runs, the chosen defaults). Here they are
    absolute token counts, clamped to what a block holds, because the service
    prefills contexts of any length.
    """

    anchor_len: int = param(256, "first tokens of the sequence, at their true positions, seen by every block (paper: 256)", zero_ok=True)
    passing_len: int = param(512, "tokens per KV head each virtual block passes on to later blocks (paper: 512)", zero_ok=True)
    pool_window: int = param(7, "odd width of the max-pool smoothing the block-key scores (ours: the paper gives none)")
    zigzag: bool = param(True, "rank r holds virtual blocks r and 2W-1-r (section 4.3); false: blocks 2r and 2r+1")
    overlap: bool = param(True, "collectives run asynchronously behind the attention (section 4.4); false: waited at once")
    question_rank: int = param(0, "the rank whose question keys count in the merge and which appends decoded KV (ours)", zero_ok=True)
    timeout_s: float = param(60.0, "a collective not completed by then fails the job (a dead or hung rank)")

    def __post_init__(self) -> None:
        if self.anchor_len < 0:
            raise SpavaConfigError(f"anchor_len must be >= 0, got {self.anchor_len}")
        if self.passing_len < 0:
            raise SpavaConfigError(f"passing_len must be >= 0, got {self.passing_len}")
        if self.pool_window < 1 or self.pool_window % 2 == 0:
            raise SpavaConfigError(f"pool_window must be an odd number >= 1, got {self.pool_window}")
        if self.question_rank < 0:
            raise SpavaConfigError(f"question_rank must be >= 0, got {self.question_rank}")
        if self.timeout_s <= 0:
            raise SpavaConfigError(f"timeout_s must be > 0, got {self.timeout_s}")

    def check_world(self, world_size: int) -> None:
        """Raise if this config cannot run on ``world_size`` ranks."""
        if world_size < 1:
            raise SpavaConfigError(f"world size must be >= 1, got {world_size}")
        if self.question_rank >= world_size:
            raise SpavaConfigError(f"question_rank {self.question_rank} is not a rank of a world of {world_size}")
