"""What a question attends to: a policy's answer to ``MemoryPolicy.select``, one type per mode.

- ``Static``: each layer's blocks, decided before the pass (full, HERMES, StreamKV, MuKV; ReKV with
  ``selection: shared``, its re-reading included: the policy reads the shortlist through
  ``PolicyHost.read_alone`` before it answers, so the result is already a set).
- ``InPass``: ReKV's retrieval inside the pass (``selection: layer``): every ``fixed`` block plus,
  in each layer, the top ``k`` of ``pool`` by that layer's question query, captured as the pass
  reaches the layer.

The engine builds the question's cache from either (``context/question_cache.py``) and reads no
other field of a policy. Both are frozen: ``plus`` returns a new selection.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from videokv_node.memory.store.block import FrameBlock
from videokv_node.memory.store.block_index import Candidates

QUERIES = ("prompt", "question")  # the rows of the pass InPass scores by: the whole prompt, or the question's own


@dataclass(frozen=True, slots=True)
class Static:
    """Per layer, the blocks the question attends to there (any order: the cache places them in
    time order, and a block that keeps no tokens in a layer is skipped there)."""

    per_layer: tuple[tuple[FrameBlock, ...], ...]  # (n_layers,) blocks per layer

    @classmethod
    def everywhere(cls, blocks: Sequence[FrameBlock], n_layers: int) -> "Static":
        """The same ``blocks`` in every layer."""
        blocks = tuple(blocks)
        return cls(tuple(blocks for _ in range(n_layers)))

    @classmethod
    def layers(cls, per_layer: Sequence[Sequence[FrameBlock]]) -> "Static":
        return cls(tuple(tuple(blocks) for blocks in per_layer))

    def plus(self, blocks: Sequence[FrameBlock]) -> "Static":
        """This selection with ``blocks`` attended in every layer too (an open segment's frames)."""
        return Static(tuple(layer + tuple(blocks) for layer in self.per_layer)) if blocks else self


@dataclass(frozen=True, slots=True)
class InPass:
    """ReKV's per-layer retrieval inside the question's one pass: ``fixed`` in every layer, plus each
    layer's top ``k`` of ``pool`` by the mean of that layer's queries over ``query``'s rows
    (``BlockIndex.top_k``). Needs uncompressed blocks of one size (every layer then attends to the
    same number of tokens); the cache refuses others."""

    fixed: tuple[FrameBlock, ...]  # attended in every layer (ReKV's recent window)
    pool: Candidates  # scored per layer on the index
    k: int  # blocks retrieved per layer, >= 0
    query: str = "prompt"  # one of QUERIES

    def __post_init__(self) -> None:
        if self.k < 0:
            raise ValueError(f"InPass.k must be >= 0, got {self.k}")
        if self.query not in QUERIES:
            raise ValueError(f"InPass.query must be one of {QUERIES}, got {self.query!r}")

    def plus(self, blocks: Sequence[FrameBlock]) -> "InPass":
        """This selection with ``blocks`` attended in every layer too."""
        return replace(self, fixed=self.fixed + tuple(blocks)) if blocks else self

    def settled(self, n_layers: int) -> "Static | InPass":
        """``Static`` when the pool holds at most ``k`` blocks (all are retrieved: nothing to score),
        else this selection."""
        if min(self.k, self.pool.count) < self.pool.count:
            return self
        return Static.everywhere(self.fixed + tuple(self.pool.blocks()), n_layers)


Selection = Static | InPass
