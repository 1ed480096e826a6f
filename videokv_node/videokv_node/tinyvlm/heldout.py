"""Held-out examples of ``videokv-tiny`` and their plain-forward accuracy: the reference every memory must match.

Fresh rendered scenes from a seed training never uses (``HELD_OUT_SEED``), half single-frame
questions and half streams of 2-6 frames, answered greedily by one plain forward over
[prefix, frames, question] and scored per question kind. The training script writes
``accuracy_by_kind``'s figure into the weights' manifest; ``tinyvlm/evaluate.py`` prints it
next to the answers the memory engine gives (``tinyvlm/engine_answers.py``).
"""

from __future__ import annotations

from collections import defaultdict

import torch
from transformers.cache_utils import DynamicCache

from videokv_node.tinyvlm.render import render
from videokv_node.tinyvlm.scenes import CHANCE, Example, SceneSampler, normalise_answer

HELD_OUT_SEED = 1_000_003  # training uses small seeds; this one draws scenes the projector never saw
CHECK_EXAMPLES = 8  # the first held-out examples, re-scored by tests/unit/test_videokv_tiny_weights.py
MAX_NEW_TOKENS = 6


def held_out_examples(n: int, seed: int = HELD_OUT_SEED) -> list[Example]:
    """``n`` examples, alternating single-frame and stream questions (2-6 frames)."""
    sampler = SceneSampler(seed)
    return [sampler.frame_question() if i % 2 == 0 else sampler.stream_question() for i in range(n)]


def held_out_photo_examples(n: int, seed: int = HELD_OUT_SEED) -> list[Example]:
    """``n`` questions about fresh crops of the training photos (crops the projector never saw; the photos
    themselves it did: this measures recognition across crops, not generalisation to new pictures)."""
    sampler = SceneSampler(seed)
    return [sampler.photo_question() for _ in range(n)]


@torch.inference_mode()
def answer(adapter, example: Example, max_new_tokens: int = MAX_NEW_TOKENS) -> str:
    """Greedy answer of one plain forward over [prefix, frames, question]: the reference every policy must match."""
    feats = adapter.encode_frames([render(s) for s in example.scenes])  # (F, T, hidden)
    q_ids = adapter.question_ids(example.question, [])
    embeds = torch.cat(
        [adapter.embed_tokens(adapter.prefix_ids()), feats.reshape(1, -1, feats.shape[-1]), adapter.embed_tokens(q_ids)], 1
    )  # (1, N, hidden)
    cache = DynamicCache()
    logits = adapter.forward(embeds, torch.arange(embeds.shape[1]), cache)
    pos, out = embeds.shape[1], []
    for _ in range(max_new_tokens):
        token = int(torch.argmax(logits))
        if token in adapter.eos_token_ids:
            break
        out.append(token)
        logits = adapter.forward(adapter.embed_tokens([token]), torch.tensor([pos]), cache)
        pos += 1
    return adapter.decode(out)


def is_right(example: Example, text: str) -> bool:
    return normalise_answer(text) == normalise_answer(example.answer)


def right_answers(adapter, examples: list[Example]) -> list[bool]:
    """Per example, whether the plain-forward greedy answer is right."""
    return [is_right(ex, answer(adapter, ex)) for ex in examples]


def accuracy_by_kind(adapter, examples: list[Example], right: list[bool] | None = None) -> tuple[dict[str, float], float]:
    """({kind: accuracy}, overall accuracy) of plain-forward greedy answers (``right``: already scored)."""
    right = right_answers(adapter, examples) if right is None else right
    hits = defaultdict(list)
    for ex, ok in zip(examples, right):
        hits[ex.kind].append(ok)
    return {k: sum(v) / len(v) for k, v in hits.items()}, sum(right) / max(1, len(right))


def chance_of(examples: list[Example]) -> float:
    return sum(CHANCE[ex.kind] for ex in examples) / max(1, len(examples))


STREAM_KINDS = ("first", "last", "after", "before", "motion")
