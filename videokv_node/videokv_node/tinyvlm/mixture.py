"""How ``train_v6`` draws its mixture: kinds weighted from the command line, v5's examples picked by kind.

Its own module so the training script stays one reading (tests/unit/test_train_v6_mixture.py tests these alone).
"""

from __future__ import annotations

import torch


def parse_weights(text: str, flag: str = "--hour-kind-weights") -> dict[str, float] | None:
    """'hour colour=3,hour shape=3' -> {'hour colour': 3.0, 'hour shape': 3.0}; '' -> None."""
    if not text.strip():
        return None
    out = {}
    for item in text.split(","):
        kind, sep, weight = item.partition("=")
        if not sep:
            raise ValueError(f"{flag}: {item!r} is not kind=weight")
        out[kind.strip()] = float(weight)
    return out


def v5_pick(kinds: list[str], n: int, weights: dict[str, float] | None, seed: int) -> list[int]:
    """Indices of v5's examples in the mixture. Without weights, ``n`` distinct ones (at most all), as v6-run1..3
    drew them; with weights, ``n`` drawn with replacement in proportion to their kind's weight (others 1), so a
    rare kind (motion: about 3% of v5's recipe) can be seen as often as the story needs. A weight must be positive
    and name a kind present."""
    gen = torch.Generator().manual_seed(seed)
    if not weights:
        return torch.randperm(len(kinds), generator=gen)[: min(len(kinds), n)].tolist()
    unknown = set(weights) - set(kinds)
    if unknown or any(w <= 0 for w in weights.values()):
        raise ValueError(f"v5 kind weights must be positive and name kinds of v5's recipe ({sorted(set(kinds))}): {weights}")
    w = torch.tensor([weights.get(k, 1.0) for k in kinds], dtype=torch.float)
    return torch.multinomial(w, n, replacement=True, generator=gen).tolist()
