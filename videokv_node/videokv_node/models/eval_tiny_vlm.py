"""Held-out accuracy of ``videokv-tiny``: fresh rendered scenes, never seen in training.

``python -m videokv_node.models.eval_tiny_vlm`` scores, per question kind and against
chance: single-frame questions (colour, shape, position, count, digit, caption) by a
plain forward, and stream questions (first/last colour, before/after, motion) answered
from memory through the memory engine under several policies. The training script uses
``accuracy_by_kind`` for the manifest's held-out figure.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from transformers.cache_utils import DynamicCache

from videokv_node.models.tiny_vlm_scenes import CHANCE, Example, SceneSampler, normalise_answer, render

HELD_OUT_SEED = 1_000_003  # training uses small seeds; this one draws scenes the projector never saw
MAX_NEW_TOKENS = 6


def held_out_examples(n: int, seed: int = HELD_OUT_SEED) -> list[Example]:
    """``n`` examples, alternating single-frame and stream questions (2-6 frames)."""
    sampler = SceneSampler(seed)
    return [sampler.frame_question() if i % 2 == 0 else sampler.stream_question() for i in range(n)]


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


def accuracy_by_kind(adapter, examples: list[Example]) -> tuple[dict[str, float], float]:
    """({kind: accuracy}, overall accuracy) of plain-forward greedy answers."""
    hits = defaultdict(list)
    for ex in examples:
        hits[ex.kind].append(is_right(ex, answer(adapter, ex)))
    overall = sum(sum(v) for v in hits.values()) / max(1, len(examples))
    return {k: sum(v) / len(v) for k, v in hits.items()}, overall


def chance_of(examples: list[Example]) -> float:
    return sum(CHANCE[ex.kind] for ex in examples) / max(1, len(examples))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=120)
    args = p.parse_args(argv)
    from videokv_node.models.videokv_tiny import VideoKVTinyAdapter

    adapter = VideoKVTinyAdapter.load()
    examples = held_out_examples(args.examples)
    by_kind, overall = accuracy_by_kind(adapter, examples)
    for kind, acc in sorted(by_kind.items()):
        print(f"{kind:10s} {acc:.3f} (chance {CHANCE[kind]:.3f})")
    print(f"overall    {overall:.3f} (chance {chance_of(examples):.3f})")


if __name__ == "__main__":
    main()
