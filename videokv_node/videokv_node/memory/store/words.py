"""The words a frame's tokens spell out, matched against what a planner asks for (``~/locate``, issue 34).

A model may write words into a frame's block (videokv-tiny v5: the encoder's classifier's nouns, from a
table of 589 plain nouns, ``models/weights/videokv-tiny/nouns.tsv``); the memory keeps them with the block
(``FrameBlock.words``). ``words_shortlist`` finds the blocks whose words a query names, for
``memory/questions/locate.py``'s likelihood re-ranking to read (and ``rekv``'s questions), one sighting at a time
(``sightings``: a thing out of view for more than ``SIGHTING_GAP_S`` is seen again), so that frames of one
moment do not crowd out another moment.

A word is named when its whole words stand in a row in the query's subject, each maybe plural by an -s,
-es or -ies ending ("the dogs" names "dog", "the toolbox" does not name "box"), or when a word of its synonym
group does (``SYNONYMS``: a planner says "couch", "bike" or "puppy" where the table says "sofa",
"bicycle" or "dog"; the table's nouns are British English, so some American ones are here too). The groups
are ours, a short hand-written list of everyday synonyms, not derived from the noun table: a word of no
group is matched only as itself. No stemming beyond those endings ("knives" does not name "knife").

A word that begins with a colour (``COLOUR_WORDS``: videokv-tiny v6's drawn things, "blue circle", and the
table's "red fox" or "green snake") is a thing of that colour, so it is also named (issue 43; ours) by
- its rest alone, unless another colour stands right before it: "the circle" names "blue circle", "the red
  circle" does not; a question about a thing's colour names the thing without its colour ("Which colour did the
  circle have?"), and until this rule no drawn thing's word was ever named by one;
- its colour before a word that stands for any thing (``ANY_THING``: "the blue thing", "a blue one", "the blue
  shape"), or its colour as the subject's last word ("Which shape was blue?"): a question about a thing's shape
  names it by its colour.
Only a colour in first place counts ("little blue heron" is named as a whole only), and a colour alone in the
middle of a subject names nothing ("the red toolbox" does not name "red square"). Grey and gray are one colour.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
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
# Basic colour terms (``names``' colour rule; British and American grey). Ours: the four drawn colours of
# videokv-tiny v6 (models/things_head.py THING_COLOURS) and the other common ones.
COLOUR_WORDS = frozenset({"red", "green", "blue", "yellow", "orange", "purple", "pink", "white", "black", "brown",
                          "grey", "gray"})
_SAME_COLOUR = {"gray": "grey"}  # one colour, two spellings


def _colour(word: str) -> str:
    return _SAME_COLOUR.get(word, word)


# Words that stand for a thing of any kind after a colour ("the green thing"); each maybe plural.
ANY_THING = frozenset({"thing", "one", "object", "shape", "item"})
_WORD = re.compile(r"[a-z]+")
# A thing out of view this long (15 sampled frames at the default sample_fps 0.5) is seen again in a new sighting
# (``sightings``); ours, not from a seed.
SIGHTING_GAP_S = 30.0


def _plurals(word: str) -> tuple[str, ...]:
    return (word + "s", word + "es") + ((word[:-1] + "ies",) if word.endswith("y") and len(word) > 2 else ())


def _same_word(said: str, word: str) -> bool:
    """``said`` is ``word``, or its plural or singular by an -s, -es or -y/-ies ending ("dogs", "boxes",
    "puppies", "jeans")."""
    return said == word or said in _plurals(word) or word in _plurals(said)


def _places(subject: list[str], want: list[str]) -> Iterator[int]:
    """Where the words ``want`` stand in a row in ``subject`` (each maybe plural): their first word's places."""
    n = len(want)
    for i in range(len(subject) - n + 1 if n else 0):
        if all(_same_word(subject[i + j], want[j]) for j in range(n)):
            yield i


def _said(subject: list[str], word: str) -> bool:
    return any(True for _ in _places(subject, _WORD.findall(word)))


def _said_by_colour(subject: list[str], word: str) -> bool:
    """The colour rule (module doc) for ``word`` = colour + rest: the rest said with no other colour right before
    it, or the colour said before a word of ``ANY_THING`` or as the subject's last word."""
    want = _WORD.findall(word)
    if len(want) < 2 or want[0] not in COLOUR_WORDS:
        return False
    colour = want[0]
    for i in _places(subject, want[1:]):
        if i == 0 or subject[i - 1] not in COLOUR_WORDS or _colour(subject[i - 1]) == _colour(colour):
            return True
    for i, w in enumerate(subject):
        if w not in COLOUR_WORDS or _colour(w) != _colour(colour):
            continue
        if i == len(subject) - 1 or any(_same_word(subject[i + 1], t) for t in ANY_THING):
            return True
    return False


def names(subject: str, word: str) -> bool:
    """Whether ``word`` (one of a frame's words, maybe several: "traffic light") is said in ``subject``, itself
    or by a synonym, or a thing of its colour by the colour rule (module doc)."""
    said = _WORD.findall(subject.lower())
    word = word.lower()
    return any(_said(said, w) or _said_by_colour(said, w) for w in _GROUP_OF.get(word, (word,)))


def sightings(blocks: Sequence["FrameBlock"], gap_s: float = SIGHTING_GAP_S) -> list[list["FrameBlock"]]:
    """``blocks`` (each a frame's or a still span's) grouped into sightings: per camera in time order, a new
    sighting where more than ``gap_s`` seconds pass from one block's last frame (a still span's end) to the
    next block's first. Sightings in order of their first frame, blocks in time order."""
    out: list[list["FrameBlock"]] = []
    by_camera: dict[str, list["FrameBlock"]] = {}
    for block in sorted(blocks, key=lambda b: (b.stamp_ns, b.block_id)):
        by_camera.setdefault(block.camera, []).append(block)
    gap_ns = round(gap_s * 1e9)
    for run in by_camera.values():
        end = None
        for block in run:
            if end is None or block.stamp_ns - end > gap_ns:
                out.append([])
            out[-1].append(block)
            end = max(end or 0, max(block.stamps_ns), block.span_end_ns)
    return sorted(out, key=lambda s: (s[0].stamp_ns, s[0].block_id))


def words_shortlist(blocks: Sequence["FrameBlock"], subject: str, limit: int) -> list["FrameBlock"]:
    """At most ``limit`` of ``blocks`` whose words ``subject`` names, one sighting at a time (``sightings``): first
    the best block of every sighting, then the second best of each, and so on; the sightings in the order of
    their best blocks. A block is better whose first named word comes earlier in its words (a frame's most
    certain word comes first), then the newer. Empty where no block has words or none is named.

    Why by sighting: a thing the cameras show often (footage with many frames the classifier calls "car") would
    otherwise fill the shortlist with its newest frames of one moment and hide a glimpse seen earlier, and a
    planner asking where something was wants its distinct moments, not the frames of one."""
    rank_of = {}
    for block in blocks:
        rank = next((i for i, w in enumerate(block.words) if names(subject, w)), None)
        if rank is not None:
            rank_of[block.block_id] = rank

    def key(b: "FrameBlock") -> tuple[int, int, int]:
        return (rank_of[b.block_id], -b.stamp_ns, b.block_id)

    groups = [sorted(s, key=key) for s in sightings([b for b in blocks if b.block_id in rank_of])]
    groups.sort(key=lambda g: key(g[0]))
    out: list["FrameBlock"] = []
    for depth in range(max(map(len, groups), default=0)):
        out += [g[depth] for g in groups if depth < len(g)]
    return out[:limit]


# A planner's question about where or when something was seen, and the request words around a thing:
# what the re-ranking strips to score the thing itself as a frame's description (``subject_of``).
_ASKING = re.compile(
    r"^(?:(?:can|could|would) you\s+)?(?:please\s+)?"
    r"(?:(?:where|when)\s+(?:did|have|had|do)\s+(?:you|we|i)\s+(?:last\s+|first\s+|ever\s+)?(?:see|seen|saw|spot|spotted|notice|noticed|find|found|observe|observed)"
    r"|(?:where|when)\s+(?:was|were|is|are)(?=\s)"
    r"|(?:did|have|had)\s+(?:you|we|i)\s+(?:ever\s+)?(?:see|seen|saw|spot|spotted|notice|noticed)"
    r"|(?:find|locate|show\s+me|look\s+for|search\s+for)(?=\s))\s+",
    re.IGNORECASE,
)
_TRAILING = re.compile(r"(?:\s+(?:last|lately|recently|before|earlier|today|please))*\s*[?.!]*\s*$", re.IGNORECASE)


def subject_of(text: str) -> str:
    """The thing a locate query asks for, as a frame's description would name it: "Where did you last see
    the red toolbox?" -> "the red toolbox"; "find a person" -> "a person". A query that is not a where/when/
    have-you-seen/find request, or that would be left empty, is returned stripped and otherwise as given
    ("What colour is the shape?", "the blue circle"). Why: the re-ranking scores the query as the model's
    description of a frame, and a frame is described by what it shows, not by the question asked of it."""
    text = text.strip()
    asked = _ASKING.match(text)
    if asked is None:
        return text
    thing = _TRAILING.sub("", text[asked.end():])
    return thing if thing else text
