"""Stage 1 of ``videokv-tiny``'s training: the projector's tokens regress onto the decoder's embeddings of the
words naming what each column of a rendered scene shows (``cell_targets``, ``align_cells``)."""

from __future__ import annotations

import torch

from videokv_node.models.videokv_tiny import Projector
from videokv_node.tinyvlm.scenes import Scene, cell_words


def cell_targets(features: dict[Scene, torch.Tensor], tokenizer, embed: torch.nn.Module) -> tuple[dict[Scene, torch.Tensor], float]:
    """Scene -> (6, hidden) decoder input embeddings of its ``cell_words`` (scenes without, photos, are left
    out), and their mean square (the scale the alignment loss is normalised by). Words take their
    leading-space token (' red'); digits their own ('7').
    Every such word is one token for SmolLM2 (tests/unit/test_videokv_tiny_weights.py); for a tokenizer
    that splits a word (the tests' tiny one), the mean of its tokens' embeddings stands in."""
    out = {}
    with torch.no_grad():
        for scene in features:
            words = cell_words(scene)
            if words is None:
                continue
            rows = []
            for word in words:
                ids = tokenizer.encode(word if word.isdigit() else f" {word}", add_special_tokens=False)
                rows.append(embed(torch.tensor(ids)).mean(0))
            out[scene] = torch.stack(rows)
        scale = torch.stack(list(out.values())).pow(2).mean().item() if out else 1.0
    return out, scale


def projector_groups(projector: Projector, lr: float, colour_lr: float | None) -> list[dict]:
    """AdamW parameter groups: the projector at ``lr``, its colour branch (v4) at ``colour_lr`` (None: ``lr``).

    Why a rate of its own: the colour branch starts at zero beside a trained map branch, and at the
    projector's rate it had not learnt to name a free shape's colour after 200 full-batch steps (the
    colour tokens nearest the right colour word: 0.44 held out); at 10x it reached 0.88 in 150 steps."""
    colour = [p for n, p in projector.named_parameters() if n.startswith("colour.")]
    rest = [p for n, p in projector.named_parameters() if not n.startswith("colour.")]
    groups = [{"params": rest, "peak": lr}]
    if colour:
        groups.append({"params": colour, "peak": colour_lr if colour_lr is not None else lr})
    return groups


def align_cells(projector: Projector, features: dict[Scene, torch.Tensor], tokenizer, embed: torch.nn.Module,
                steps: int, lr: float, colour_lr: float | None = None) -> list[tuple[int, float]]:
    """Stage 1: each visual token regresses onto the decoder's input embedding of the word naming what its
    column holds (``cell_words``: colour, then shape), normalised MSE, full batch over every encoded scene.

    Our choice, in place of LLaVA's caption pre-training stage, which needs decoder passes that 2
    shared CPU cores cannot afford: this needs none, and leaves the decoder reading visual tokens
    that sit next to the words ' red', ' circle', ... so stage 2 (the answer loss) starts close.
    """
    if projector.grid != (2, 3):
        raise ValueError("cell alignment is defined for the 2 x 3 grid the scenes are laid out on")
    targets, scale = cell_targets(features, tokenizer, embed)
    scenes = list(targets)  # the rendered scenes: photos have no cell words
    y = torch.stack([targets[s] for s in scenes])  # (S, 6, hidden)
    x = torch.stack([features[s] for s in scenes])  # (S, cols, rows * (1280 + 80))
    groups = projector_groups(projector, lr, colour_lr)
    opt = torch.optim.AdamW([{"params": g["params"], "lr": g["peak"]} for g in groups], weight_decay=0.0)
    curve = []
    projector.train()
    for step in range(steps):
        loss = (projector.project(x) - y).pow(2).mean() / scale
        opt.zero_grad()
        loss.backward()
        opt.step()
        if (step + 1) % 50 == 0 or step + 1 == steps:
            curve.append((step + 1, loss.item()))
            print(f"align {step + 1}/{steps} loss {loss.item():.4f}", flush=True)
    projector.eval()
    return curve
