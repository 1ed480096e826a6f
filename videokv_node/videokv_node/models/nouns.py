"""The nouns a frame shows, as text tokens in its block: ``videokv-tiny`` v5 (issue 34).

The frozen encoder (EfficientNet-Lite0) keeps its ImageNet-1k classifier. Per frame, its softmax is
summed per noun of the noun table (``nouns.tsv`` beside the weights: the 1,000 classes -> the plain
noun a planner uses, many classes to one noun, '' for none; drafted by scripts/draft_noun_table.py
and reviewed by hand), and the ``slots`` most probable nouns whose summed probability reaches
``threshold`` are written after the frame's visual tokens as the decoder's own token embeddings
(``embed_tokens``) of ' mug', ' traffic light', ..., each noun in a slot of ``slot_tokens`` tokens
filled up with the pad token (','), a slot with no noun all pad. So a frame's block is always
``rows * cols + slots * slot_tokens`` tokens (the memory engine needs a fixed ``tokens_per_frame``), and
the engine, every memory policy, RoPE and snapshots see just a longer block.

Why text tokens and not only a classifier-taught projector: the decoder already reads its own
words; a projector taught on a few dozen real photographs would name those photographs' things,
the block names any of the table's 589 nouns (the model learns to read and repeat it, v5's training).

Everything in ``NounBlock.forward`` is a matrix product, a top-k, a comparison and a gather, so the
vision backends' ONNX export carries it with the encoder and projector.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

NOUNS_FILE = "nouns.tsv"  # index, ImageNet class (first synonym), noun ('' for none); beside the weights
N_CLASSES = 1000
READ_TOLERANCE = 0.02  # a slot read back (NounBlock.read) within 2% of a noun's slot embedding's norm is that noun:
# bfloat16 rounds by 0.4%, and two different nouns' slots differ by far more (they differ in whole token embeddings)


def read_noun_table(path: str | Path) -> list[str]:
    """The table's nouns, one per ImageNet class in index order ('' where a class has none)."""
    lines = Path(path).read_text().splitlines()
    if lines[0].split("\t") != ["index", "class", "noun"]:
        raise ValueError(f"{path}: not a noun table (header {lines[0]!r})")
    nouns = []
    for i, line in enumerate(lines[1:]):
        index, _, noun = line.split("\t")
        if int(index) != i:
            raise ValueError(f"{path}: row {i} has index {index}")
        nouns.append(noun)
    if len(nouns) != N_CLASSES:
        raise ValueError(f"{path}: {len(nouns)} classes, expected {N_CLASSES}")
    return nouns


def article(noun: str) -> str:
    """'a mug', 'an orange': how answers name a noun."""
    return f"{'an' if noun[0] in 'aeiouAEIOU' else 'a'} {noun}"


@dataclass(frozen=True, slots=True)
class NounConfig:
    """The manifest's ``nouns`` entry."""

    file: str = NOUNS_FILE  # the table, beside the weights
    slots: int = 2  # nouns per frame at most, most probable first
    slot_tokens: int = 3  # tokens per slot: the noun's, then the pad
    threshold: float = 0.1  # a noun's summed class probability must reach this to be written
    pad: str = ","  # fills a slot; a slot with no noun is all pad
    # v6 (issue 43): words of another head (``models/things_head.py``: "red triangle") written where its probability
    # reaches this, before any of the classifier's nouns (a drawn thing is what a frame shows that ImageNet has no
    # class for; the classifier's nouns fill the slots it leaves)
    extra_threshold: float = 0.5

    def __post_init__(self):
        if (self.slots < 1 or self.slot_tokens < 1 or not 0.0 < self.threshold < 1.0
                or not 0.0 < self.extra_threshold < 1.0):
            raise ValueError(f"bad noun block {self}")


class NounBlock(nn.Module):
    """ImageNet logits -> (B, slots * slot_tokens, hidden) embeddings of the frame's nouns (see the module doc).

    Noun index 0 is 'no noun' (the pad slot); 1.. the table's distinct nouns in sorted order, then ``extra``
    (v6: another head's words, ``models/things_head.py``), in their order. Buffers only: nothing here is trained,
    the embeddings are the decoder's frozen input embeddings.
    """

    def __init__(self, class_nouns: list[str], tokenizer, embed: nn.Module, config: NounConfig = NounConfig(),
                 extra: tuple[str, ...] = ()):
        super().__init__()
        self.config = config
        table = sorted(set(class_nouns) - {""})
        clash = set(extra) & set(table)
        if clash or len(set(extra)) != len(extra):
            raise ValueError(f"extra words must be distinct and not the table's nouns: {sorted(clash) or list(extra)}")
        self.extra = tuple(extra)
        self.nouns = ["", *table, *self.extra]  # index -> noun
        index = {n: i for i, n in enumerate(self.nouns)}
        to_noun = torch.zeros(len(class_nouns), len(self.nouns))  # the extra words' columns stay 0
        to_noun[torch.arange(len(class_nouns)), torch.tensor([index[n] for n in class_nouns])] = 1.0
        self.register_buffer("class_to_noun", to_noun)  # (classes, nouns): column 0 gathers the classes of no noun
        pad = tokenizer.encode(config.pad, add_special_tokens=False)
        if len(pad) != 1:
            raise ValueError(f"the pad {config.pad!r} must be one token")
        ids = torch.full((len(self.nouns), config.slot_tokens), pad[0], dtype=torch.long)
        for i, noun in enumerate(self.nouns[1:], 1):
            # A noun longer than a slot is cut: never for SmolLM2 (tests/unit/test_noun_table.py), only for
            # the tests' tiny tokenizer.
            word = tokenizer.encode(f" {noun}", add_special_tokens=False)[: config.slot_tokens]
            ids[i, : len(word)] = torch.tensor(word)
        self.register_buffer("slot_ids", ids)  # (nouns, slot_tokens) token ids
        with torch.no_grad():
            weight = embed.weight
            self.register_buffer("slot_embeds", weight[ids.to(weight.device)].detach().clone().cpu())  # (nouns, S, hidden)

    @property
    def tokens(self) -> int:
        """Tokens the block adds to a frame."""
        return self.config.slots * self.config.slot_tokens

    def noun_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(B, classes) logits -> (B, nouns) summed softmax probability per noun (column 0: classes of no noun)."""
        return logits.softmax(-1).to(self.class_to_noun.dtype) @ self.class_to_noun

    def top(self, logits: torch.Tensor, extra_probs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, slots) noun indices (0 where below the threshold), most probable first, and their probabilities.

        ``extra_probs`` (B, len(extra)): the extra words' probabilities; one reaching ``extra_threshold`` ranks
        above every classifier noun (its score is lifted by 1: a summed softmax never exceeds 1), so a frame with a
        drawn thing names it first and the classifier's nouns fill what slots remain."""
        p = self.noun_probs(logits)[:, 1:]
        if self.extra:
            if extra_probs is None:
                raise ValueError("this noun block writes extra words: pass their probabilities")
            e = extra_probs.to(p.dtype)
            lifted = torch.where(e >= self.config.extra_threshold, e + 1.0, torch.zeros_like(e))
            p = torch.cat([p[:, : -len(self.extra)], lifted], -1)
        score, i = p.topk(self.config.slots, -1)
        index = torch.where(score >= self.config.threshold, i + 1, torch.zeros_like(i))
        return index, torch.where(score > 1.0, score - 1.0, score)

    def embed_slots(self, index: torch.Tensor) -> torch.Tensor:
        """(B, slots) noun indices -> (B, slots * slot_tokens, hidden) embeddings."""
        return self.slot_embeds[index].flatten(1, 2)

    def forward(self, logits: torch.Tensor, extra_probs: torch.Tensor | None = None) -> torch.Tensor:
        return self.embed_slots(self.top(logits, extra_probs)[0])

    def read(self, block: torch.Tensor) -> list[tuple[str, ...]]:
        """(F, slots * slot_tokens, hidden) noun blocks as ``forward`` wrote them -> per frame the nouns, most
        probable first. Each slot is matched to the nearest of the table's slot embeddings and kept only where
        it is that slot to within ``READ_TOLERANCE`` of its norm (a block in half precision, or from a vision
        backend's engine, is the same noun; a slot that is no noun's, e.g. two frames' blocks averaged by a
        policy, reads as none). The pad slot (index 0) is left out."""
        f = block.shape[0]
        slots = block.detach().reshape(f, self.config.slots, -1).float()  # (F, slots, S * hidden)
        table = self.slot_embeds.flatten(1).to(slots.device, torch.float32)  # (nouns, S * hidden)
        dist = torch.cdist(slots, table[None].expand(f, -1, -1))  # (F, slots, nouns)
        best, index = dist.min(-1)
        exact = best <= READ_TOLERANCE * table[index].norm(dim=-1)
        index = torch.where(exact, index, torch.zeros_like(index))
        return [tuple(names) for names in self.names(index)]

    def names(self, index: torch.Tensor) -> list[list[str]]:
        """(B, slots) indices -> per frame the nouns written (pad slots left out)."""
        return [[self.nouns[i] for i in row if i] for row in index.tolist()]
