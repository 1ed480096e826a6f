"""The blocks held, by the words their frames' tokens spell out (``FrameBlock.words``; issue 34).

Kept by ``BlockStore`` as blocks enter and leave, so a question finds the blocks whose words it names
(``memory/store/words.py`` ``names``) by reading each distinct word once, not each block: its cost grows with
the words in memory (at most the model's vocabulary of them, 589 nouns for videokv-tiny v5), not with
the frames. A block's words never change while it is held (set before it is stored).
"""

from __future__ import annotations

from videokv_node.memory.store.block import FrameBlock
from videokv_node.memory.store.words import names


class WordIndex:
    """word -> {block id: the word's place in that block's words (0: its frame's most certain)}."""

    def __init__(self) -> None:
        self._ids: dict[str, dict[int, int]] = {}

    def __len__(self) -> int:
        """Distinct words held."""
        return len(self._ids)

    def add(self, block: FrameBlock) -> None:
        for rank, word in enumerate(block.words):
            self._ids.setdefault(word, {})[block.block_id] = rank

    def remove(self, block: FrameBlock) -> None:
        for word in block.words:
            ids = self._ids.get(word)
            if ids is not None:
                ids.pop(block.block_id, None)
                if not ids:
                    del self._ids[word]

    def clear(self) -> None:
        self._ids.clear()

    def named(self, subject: str) -> dict[int, int]:
        """The ids of the blocks with a word ``subject`` names, each with the best place of such a word in it."""
        out: dict[int, int] = {}
        for word, ids in self._ids.items():
            if names(subject, word):
                for block_id, rank in ids.items():
                    out[block_id] = min(rank, out.get(block_id, rank))
        return out
