"""The words a frame's tokens spell out, matched against what a planner asks for (``~/locate``, issue 34).

A model may write words into a frame's block (videokv-tiny v5: the encoder's classifier's nouns, from a
table of 589 plain nouns, ``models/weights/videokv-tiny/nouns.tsv``); the memory keeps them with the block
(``FrameBlock.words``). ``words_shortlist`` finds the blocks whose words a query names, for
``memory/locate.py``'s likelihood re-ranking to read.

A word is named when its whole words stand in a row in the query's subject, each maybe plural by an -s,
-es or -ies ending ("the dogs" names "dog", "the toolbox" does not name "box"), or when a word of its synonym
group does (``SYNONYMS``: a planner says "couch", "bike" or "puppy" where the table says "sofa",
"bicycle" or "dog"; the table's nouns are British English, so some American ones are here too). The groups
are ours, a short hand-written list of everyday synonyms, not derived from the noun table: a word of no
group is matched only as itself. No stemming beyond those endings ("knives" does not name "knife").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the store's word index imports this module
    from videokv_node.memory.store.block import FrameBlock

# Everyday synonyms, each group naming each other (case and plurals as in ``names``).
SYNONYMS: tuple[frozenset[str], ...] = tuple(frozenset(g) for g in (
    {"sofa", "couch", "settee"},
    {"bicycle", "bike"},
    {"dog", "puppy", "hound"},
    {"cat", "kitten", "kitty"},
    {"car", "automobile"},
    {"phone", "cellphone", "cell phone", "mobile phone", "smartphone", "telephone"},
    {"television", "tv", "telly"},
    {"trash can", "garbage can", "rubbish bin", "bin", "waste bin", "dustbin"},
    {"tool kit", "toolbox", "tool box"},
    {"torch", "flashlight"},
    {"fridge", "refrigerator"},
    {"courgette", "zucchini"},
    {"nappy", "diaper"},
    {"plane", "airplane", "aeroplane", "aircraft"},
    {"football", "soccer ball"},
    {"mug", "cup"},
    {"monitor", "screen", "display"},
    {"laptop", "notebook computer"},
    {"truck", "lorry"},
    {"motorbike", "motorcycle", "scooter"},
    {"sweatshirt", "hoodie", "jumper", "sweater"},
    {"trousers", "pants", "jeans"},
))
_GROUP_OF = {w: g for g in SYNONYMS for w in g}
_WORD = re.compile(r"[a-z]+")


def _plurals(word: str) -> tuple[str, ...]:
    return (word + "s", word + "es") + ((word[:-1] + "ies",) if word.endswith("y") and len(word) > 2 else ())


def _same_word(said: str, word: str) -> bool:
    """``said`` is ``word``, or its plural or singular by an -s, -es or -y/-ies ending ("dogs", "boxes",
    "puppies", "jeans")."""
    return said == word or said in _plurals(word) or word in _plurals(said)


def _said(subject: list[str], word: str) -> bool:
    want = _WORD.findall(word)
    n = len(want)
    return n > 0 and any(all(_same_word(subject[i + j], want[j]) for j in range(n)) for i in range(len(subject) - n + 1))


def names(subject: str, word: str) -> bool:
    """Whether ``word`` (one of a frame's words, maybe several: "traffic light") is said in ``subject``, itself
    or by a synonym (module doc)."""
    said = _WORD.findall(subject.lower())
    word = word.lower()
    return any(_said(said, w) for w in _GROUP_OF.get(word, (word,)))


def words_shortlist(blocks: Sequence["FrameBlock"], subject: str, limit: int) -> list["FrameBlock"]:
    """At most ``limit`` of ``blocks`` whose words ``subject`` names: those whose first named word comes earlier
    in their words first (a frame's most certain word comes first), then the newest. Empty where no block has
    words or none is named."""
    found = []
    for block in blocks:
        rank = next((i for i, w in enumerate(block.words) if names(subject, w)), None)
        if rank is not None:
            found.append((rank, -block.stamp_ns, block.block_id, block))
    found.sort(key=lambda f: f[:3])
    return [f[3] for f in found[:limit]]
