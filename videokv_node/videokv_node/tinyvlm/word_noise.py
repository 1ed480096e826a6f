"""The head's words in training as a held-out frame gets them: sometimes missing, miscoloured or false.

Why: ``train_v6`` writes each training frame's noun block from the drawn-things head's probabilities on
the very frames the head was trained on, where it names 98% of single things and writes no false word
(v6.3's head, ``v6-run3``: train 0.977 named, 0.0 false; val 0.893 / 1.5%; test 0.852 / 6.9%). The decoder
so learnt to read a drawn thing's colour from its words (single val frames: 164 of 165 right when the
words name it, 14 of 35 when they do not), and at the hour's test ceiling the head's misses became the
decoder's: over v6.3's 13 wrong answers the needles' things were named in 3, written in another colour
in 5 and unnamed in 7 (docs/notes/2026-11-29-issue43-v64-candidate.md). Noise at about held-out rates makes the
words unreliable in training as they are out of it, so the decoder must also read the frame's tokens.

Our choice (no seed paper covers it; word dropout as in any model that reads a noisy upstream tagger):
per frame and per showing, independently, with the trainer's generator:

- ``drop``: a frame whose block holds a head word gets the block the classifier alone writes (the
  head's probabilities all zero, so the classifier's nouns fill the slots, as ``NounBlock.top`` does
  when the head misses);
- ``swap``: otherwise, with this probability, each head word is written in another of the head's
  colours, same shape (the head's miscolourings keep the shape: baboon's green circle read "red circle");
- ``false``: a frame with no head word gets one, drawn uniformly from the head's words, in the first slot
  (the classifier's first noun moves to the second, its last falls out), as a false positive ranks.

The answer keys stay true. Off (all zero) unless ``train_v6 --word-noise`` says otherwise. Measured
(2026-11-30, docs/notes/2026-11-30-issue43-word-noise.md): the decoder does learn to read colour without
the words (single val frames where they miss: 14 -> 18 -> 22 of 35 as the noise grows), but heavier noise
costs the hour's val ceiling (215 -> 199/240) and the mild run, read on test, lost 5 of 78 at the ceiling;
``drop`` alone (0.3) teaches nothing of it (13 of 35): the contradicting words do. No shipped model uses it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class WordNoise:
    drop: float = 0.0
    swap: float = 0.0
    false: float = 0.0

    def __post_init__(self):
        if min(self.drop, self.swap, self.false) < 0.0 or self.drop + self.swap > 1.0 or self.false > 1.0:
            raise ValueError(f"word noise rates must be probabilities with drop + swap <= 1: {self}")

    @classmethod
    def parse(cls, text: str) -> "WordNoise":
        """'drop=0.2,swap=0.05,false=0.03' (any subset; '' is no noise)."""
        rates = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, value = part.partition("=")
            if not sep or key.strip() not in cls.__dataclass_fields__:
                raise ValueError(f"word noise: expected drop=, swap= or false=, got {part!r}")
            rates[key.strip()] = float(value)
        return cls(**rates)

    def __bool__(self) -> bool:
        return bool(self.drop or self.swap or self.false)


class WordNoiser:
    """Applies a ``WordNoise`` to noun-block indices. ``nouns``: the block's index -> word list
    (``NounBlock.nouns``, the head's words last), ``extra``: the head's words ("<colour> <shape>")."""

    def __init__(self, noise: WordNoise, nouns: list[str], extra: tuple[str, ...]):
        if not extra or tuple(nouns[len(nouns) - len(extra):]) != tuple(extra):
            raise ValueError("the noun list must end with the head's words")
        self.noise = noise
        self.first, self.n_extra = len(nouns) - len(extra), len(extra)  # indices >= first are the head's words
        shape = [w.split(" ", 1)[1] for w in extra]
        # each head word's other colours of the same shape
        self.partners = {self.first + i: [self.first + j for j in range(len(extra)) if j != i and shape[j] == shape[i]]
                         for i in range(len(extra))}

    def __call__(self, index: torch.Tensor, bare: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        """(slots,) indices as the head and classifier wrote them, (slots,) as the classifier alone did ->
        the indices this showing of the frame gets."""
        u = float(torch.rand((), generator=gen))
        if bool((index >= self.first).any()):
            if u < self.noise.drop:
                return bare
            if u < self.noise.drop + self.noise.swap:
                out = index.clone()
                for k, i in enumerate(index.tolist()):
                    if i >= self.first and self.partners[i]:
                        options = self.partners[i]
                        out[k] = options[int(torch.randint(len(options), (), generator=gen))]
                return out
            return index
        if u < self.noise.false:
            word = self.first + int(torch.randint(self.n_extra, (), generator=gen))
            return torch.cat([torch.tensor([word], dtype=index.dtype), index[:-1]])
        return index
