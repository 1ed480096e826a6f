"""Where every token of a Spava prefill lives: anchor, ZigZag context blocks over 2W virtual hosts, question.

Pure index math (paper sections 3.2 and 4.3, appendix B.2), no processes, so it
is unit-tested on its own. Global token order is [anchor | context | question].
The context is cut into 2W contiguous virtual blocks; when it does not divide
evenly, the first ``context % 2W`` blocks are one token longer (ours: the paper
assumes equal blocks). With ``zigzag`` rank r holds virtual blocks r and 2W-1-r,
which makes the passing-block work of every rank the same (``prefill_work``).
"""

from __future__ import annotations

from dataclasses import dataclass

from videokv_node.spava.config import SpavaConfig, SpavaConfigError


def even_split(n: int, parts: int) -> list[int]:
    """Sizes of ``parts`` contiguous pieces of ``n``: the first ``n % parts`` one longer."""
    base, extra = divmod(n, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def virtual_blocks_of(rank: int, world: int, zigzag: bool) -> tuple[int, int]:
    """The two virtual blocks rank ``rank`` holds, ascending."""
    return (rank, 2 * world - 1 - rank) if zigzag else (2 * rank, 2 * rank + 1)


@dataclass(frozen=True, slots=True)
class Layout:
    """Token ranges of one prefill of ``total`` tokens on ``world`` ranks.

    Invariants: the anchor, the 2W blocks and the question tile [0, total)
    in order; every block range is contiguous; ``anchor_len`` is the config's,
    clamped so the question is never inside the anchor.
    """

    total: int  # tokens in the sequence (anchor + context + question)
    question_len: int  # tokens of the question block at the end
    world: int  # ranks (physical hosts); 2 * world virtual hosts
    anchor_len: int  # tokens of the anchor block at the start
    zigzag: bool  # rank r holds virtual blocks r and 2W-1-r (else 2r, 2r+1)
    passing_len: int  # the config's passing length (per block clamped by ``passing_of``)

    @classmethod
    def build(cls, cfg: SpavaConfig, total: int, question_len: int, world: int) -> "Layout":
        cfg.check_world(world)
        if question_len < 1 or question_len > total:
            raise SpavaConfigError(f"question_len must be in [1, total={total}], got {question_len}")
        anchor = min(cfg.anchor_len, total - question_len)
        return cls(total, question_len, world, anchor, cfg.zigzag, cfg.passing_len)

    @property
    def n_virtual(self) -> int:
        return 2 * self.world

    @property
    def question_start(self) -> int:
        return self.total - self.question_len

    def block_bounds(self, v: int) -> tuple[int, int]:
        """[start, end) of virtual block ``v`` in global positions."""
        sizes = even_split(self.question_start - self.anchor_len, self.n_virtual)
        start = self.anchor_len + sum(sizes[:v])
        return start, start + sizes[v]

    def block_len(self, v: int) -> int:
        start, end = self.block_bounds(v)
        return end - start

    def passing_of(self, v: int) -> int:
        """Tokens per KV head virtual block ``v`` passes on: passing_len, clamped to the block."""
        return min(self.passing_len, self.block_len(v))

    def blocks_of(self, rank: int) -> tuple[int, int]:
        return virtual_blocks_of(rank, self.world, self.zigzag)

    def rank_of_block(self, v: int) -> int:
        if self.zigzag:
            return v if v < self.world else self.n_virtual - 1 - v
        return v // 2

    def anchor_slice(self, rank: int) -> tuple[int, int]:
        """[start, end) of the anchor part rank ``rank`` attends the question to (appendix B.2)."""
        sizes = even_split(self.anchor_len, self.world)
        start = sum(sizes[:rank])
        return start, start + sizes[rank]

    def local_ranges(self, rank: int) -> list[tuple[int, int]]:
        """Global [start, end) ranges a rank runs through the decoder, in its local order:
        anchor, its two blocks (ascending), question."""
        a, b = self.blocks_of(rank)
        return [(0, self.anchor_len), self.block_bounds(a), self.block_bounds(b), (self.question_start, self.total)]

    def local_positions(self, rank: int) -> list[int]:
        """Global position of each local token of ``rank``."""
        return [p for start, end in self.local_ranges(rank) for p in range(start, end)]

    def prefill_work(self, rank: int) -> dict[str, int]:
        """(query, key) pairs ``rank`` scores in one layer, by part (paper eq. 7).

        anchor: causal within the anchor (the same on every rank); blocks: each
        held block against the anchor, the passing blocks of earlier virtual
        blocks and itself causally; question: its anchor slice, its blocks and,
        on one rank, itself causally (``question_rank``: pass it in ``owns_question``
        semantics through ``question_owner``).
        """
        a = self.anchor_len
        blocks = 0
        for v in self.blocks_of(rank):
            n = self.block_len(v)
            passing = sum(self.passing_of(u) for u in range(v))
            blocks += n * a + n * passing + n * (n + 1) // 2
        s0, s1 = self.anchor_slice(rank)
        q = self.question_len
        held = sum(self.block_len(v) for v in self.blocks_of(rank))
        return {"anchor": a * (a + 1) // 2, "blocks": blocks, "question": q * (s1 - s0 + held)}
