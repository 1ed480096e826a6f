"""Train ``videokv-tiny`` v6's drawn-things head: ``python -m videokv_node.tinyvlm.train_things_head``.

The head (``models/things_head.py``) reads the frozen encoder's cells, so each frame of
``tinyvlm/drawn.py`` is encoded once (``drawn_features.encode_drawn``) and the head trains on the cache in
minutes: binary cross-entropy of each thing's frame-level logit (the largest over the cells) against whether
the frame shows it. Seeded and deterministic on one thread count.

Scored (``score``) as the noun block uses it: the words a frame gets are the things whose probability reaches
the threshold, at most ``slots`` of them; per split, the share of frames whose written words are exactly the
drawn things, the share of frames with nothing drawn that get a word anyway (a false word puts a shape into the
memory's word index and the decoder's context: it must be rare), and per drawn thing whether its word is
written, by size. ``val`` picks the checkpoint (``val_score``, every 100 steps) and the threshold (the lowest whose false-word rate is
under ``--max-false``); ``test`` (held-out footage, and held-out sizes) is only reported.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from videokv_node.models.things_head import HEAD_FILE, THING_NAMES, ThingHead
from videokv_node.tinyvlm.drawn import (
    COLOURFUL_TRAIN_PHOTOS, FRAME_SIZE, HEAD_EXTRA_PHOTOS, SHAPE_DRAWINGS, DrawnFrame, DrawnSampler,
)

SIZE_BINS = ((0.0, 0.28), (0.28, 0.36), (0.36, 0.5), (0.5, 1.0))


def targets(frames: list[DrawnFrame], names: tuple[str, ...] = THING_NAMES) -> torch.Tensor:
    """(F, things) 1.0 where the frame shows that thing."""
    index = {n: i for i, n in enumerate(names)}
    y = torch.zeros(len(frames), len(names))
    for r, f in enumerate(frames):
        for n in f.names:
            y[r, index[n]] = 1.0
    return y


def cell_targets(frames: list[DrawnFrame], grid: int, names: tuple[str, ...] = THING_NAMES,
                 aspect: float = FRAME_SIZE[0] / FRAME_SIZE[1]) -> tuple[torch.Tensor, torch.Tensor]:
    """(F, grid * grid, things) targets and weights of the cell loss (``fit``'s ``cell_weight``), cells in row-major
    order over the encoder's square input (a thing's x, y and side are shares of the frame, so they map straight onto
    the grid). For each drawn thing: positive on the cell holding its centre and on every cell whose centre lies in
    its bounding box; weight 0 (not scored) on the other cells its box overlaps; every other (cell, thing) negative.
    Why: the frame's logit is the largest cell's, so a frame-level loss trains one cell per frame and thing; the cells
    of a busy backdrop beside a drawn shape are never told they are not one. Measured on val (2026-11-29, weight 1): more
    false words on a cartoon backdrop (HappyFish 1 -> 8 of 32 frames), so off by default (``--cell-weight 0``)."""
    y = torch.zeros(len(frames), grid * grid, len(names))
    w = torch.ones_like(y)
    index = {n: i for i, n in enumerate(names)}
    centre = (torch.arange(grid) + 0.5) / grid
    for i, f in enumerate(frames):
        for t in f.things:
            k = index[t.name]
            half_x, half_y = t.side / 2 / aspect, t.side / 2
            dx, dy = (centre - t.x).abs(), (centre - t.y).abs()
            inside = (dy[:, None] <= half_y) & (dx[None, :] <= half_x)
            inside[min(int(t.y * grid), grid - 1), min(int(t.x * grid), grid - 1)] = True
            overlap = (dy[:, None] < half_y + 0.5 / grid) & (dx[None, :] < half_x + 0.5 / grid)
            w[i, :, k] = torch.where((overlap & ~inside).flatten(), 0.0, w[i, :, k])
            y[i, :, k] = torch.maximum(y[i, :, k], inside.flatten().float())
            w[i, :, k] = torch.maximum(w[i, :, k], inside.flatten().float())
    return y, w


def written(probs: torch.Tensor, threshold: float, slots: int, names: tuple[str, ...] = THING_NAMES) -> list[set[str]]:
    """Per frame the words the noun block would write: the ``slots`` most probable reaching ``threshold``."""
    p, i = probs.topk(min(slots, probs.shape[1]), -1)
    return [{names[j] for j, q in zip(row_i, row_p) if q >= threshold} for row_i, row_p in zip(i.tolist(), p.tolist())]


def score(probs: torch.Tensor, frames: list[DrawnFrame], threshold: float, slots: int = 2) -> dict:
    words = written(probs, threshold, slots)
    exact = [w == set(f.names[:slots]) if len(f.names) <= slots else w <= set(f.names) and len(w) == slots
             for w, f in zip(words, frames)]
    empty = [bool(w) for w, f in zip(words, frames) if not f.things]
    single = [(w, f.things[0]) for w, f in zip(words, frames) if len(f.things) == 1]
    by_size: dict[str, list[bool]] = {f"{lo:.2f}-{hi:.2f}": [] for lo, hi in SIZE_BINS}
    for w, f in zip(words, frames):
        for t in f.things:
            key = next(f"{lo:.2f}-{hi:.2f}" for lo, hi in SIZE_BINS if lo <= t.side < hi)
            by_size[key].append(t.name in w)
    mean = lambda xs: round(sum(xs) / len(xs), 4) if xs else None  # noqa: E731
    return {
        "frames": len(frames), "threshold": threshold,
        "exact_words": mean(exact),
        "false_word_rate": mean(empty), "frames_without_things": len(empty),
        "false_words_by_source": false_words_by_source(words, frames),
        "named_by_source": named_by_source(words, frames),
        "single_colour": mean([any(x.split()[0] == t.colour for x in w) for w, t in single]),
        "single_shape": mean([any(x.split()[1] == t.shape for x in w) for w, t in single]),
        "single_named": mean([t.name in w for w, t in single]), "single_frames": len(single),
        "named_by_side": {k: mean(v) for k, v in by_size.items()},
    }


def false_words_by_source(words: list[set[str]], frames: list[DrawnFrame]) -> dict[str, dict]:
    """Per source, of its frames with nothing drawn: how many, how many got a word, and which words how often (most
    first). Why: a split's false-word rate can be one source's (test: the carphone clip's red bow tie and blue-striped
    seat read as a red and a blue triangle, 2026-11-29), which the split's mean hides and a head's threshold then
    cannot be judged by."""
    out: dict[str, dict] = {}
    for w, f in zip(words, frames):
        if f.things:
            continue
        entry = out.setdefault(f.source, {"frames": 0, "with_words": 0, "words": {}})
        entry["frames"] += 1
        entry["with_words"] += bool(w)
        for name in w:
            entry["words"][name] = entry["words"].get(name, 0) + 1
    for entry in out.values():
        entry["words"] = dict(sorted(entry["words"].items(), key=lambda kv: (-kv[1], kv[0])))
    return dict(sorted(out.items()))


WORD_CLASSES = ("named", "miscoloured", "misshaped", "unnamed")  # best first


def word_class(name: str, words) -> str:
    """How a frame's ``words`` name a drawn thing called ``name`` ('green circle'): its name written, its shape with
    another colour, its colour with another shape, or none of them. Only the head's words count (a noun such as
    'green pepper' is not one)."""
    colour, shape = name.split(" ", 1)
    if name in words:
        return "named"
    pairs = [w.split(" ", 1) for w in words if w in THING_NAMES]
    if any(s == shape for _, s in pairs):
        return "miscoloured"
    if any(c == colour for c, _ in pairs):
        return "misshaped"
    return "unnamed"


def named_by_source(words: list[set[str]], frames: list[DrawnFrame]) -> dict[str, dict]:
    """Per source, of the things drawn on it: how many, how many named exactly, how many written with another colour
    (their shape right). Why: the test hour's ceiling lost its needles on saturated photographs (baboon, orange,
    squirrel: no word, or the wrong colour), which a split's mean hides (2026-11-29)."""
    out: dict[str, dict] = {}
    for w, f in zip(words, frames):
        for t in f.things:
            entry = out.setdefault(f.source, {"things": 0, "named": 0, "miscoloured": 0})
            c = word_class(t.name, w)
            entry["things"] += 1
            entry["named"] += c == "named"
            entry["miscoloured"] += c == "miscoloured"
    return dict(sorted(out.items()))


def pick_threshold(probs: torch.Tensor, frames: list[DrawnFrame], max_false: float) -> float:
    """The lowest threshold of a grid whose false-word rate on ``frames`` is at most ``max_false``."""
    for t in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95):
        if score(probs, frames, t)["false_word_rate"] <= max_false:
            return t
    return 0.95


def val_score(s: dict) -> float:
    """What picks a head between checkpoints (on ``val``, never ``test``): things named minus 3x the false words."""
    return s["single_named"] - 3 * s["false_word_rate"]


def fit(head: ThingHead, cells: torch.Tensor, y: torch.Tensor, steps: int, batch: int, lr: float, seed: int,
        weight_decay: float = 1e-4, val=None, log=print, cells_y: tuple[torch.Tensor, torch.Tensor] | None = None,
        cell_weight: float = 0.0) -> tuple[list[list[float]], list[list[float]]]:
    """AdamW with a cosine schedule on (F, cells, dim) float16 cells; returns the loss curve [[step, loss]] and the
    validation curve [[step, val_score]]. ``val`` = (cells, frames): every 100 steps the head is scored there (at
    threshold 0.9) and the best state is kept (early stopping on the second split). ``cells_y`` = ``cell_targets``'
    (targets, weights): adds ``cell_weight`` times the weighted cell-level cross-entropy to the frame-level one."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=weight_decay)
    curve, acc, val_curve, best = [], [], [], (float("-inf"), None)
    head.train()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr * (0.05 + 0.95 * 0.5 * (1 + torch.cos(torch.tensor(step / steps * 3.14159265)).item()))
        idx = torch.randint(0, len(cells), (batch,), generator=gen)
        cell_logits = head.cell_logits(cells[idx].float())
        loss = F.binary_cross_entropy_with_logits(cell_logits.amax(-2), y[idx])
        if cells_y is not None and cell_weight > 0:
            wt = cells_y[1][idx]
            per = F.binary_cross_entropy_with_logits(cell_logits, cells_y[0][idx], weight=wt, reduction="sum")
            loss = loss + cell_weight * per / wt.sum().clamp_min(1.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
        acc.append(loss.item())
        if (step + 1) % 100 == 0:
            curve.append([step + 1, round(sum(acc) / len(acc), 5)])
            acc = []
            msg = f"head step {step + 1}/{steps} loss {curve[-1][1]:.4f}"
            if val is not None:
                head.eval()
                v = val_score(score(probs_of(head, val[0]), val[1], 0.9))
                head.train()
                val_curve.append([step + 1, round(v, 4)])
                msg += f" val {v:.4f}"
                if v > best[0]:
                    best = (v, {k: t.detach().clone() for k, t in head.state_dict().items()})
            log(msg)
    head.eval()
    if best[1] is not None:
        head.load_state_dict(best[1])
    return curve, val_curve


@torch.no_grad()
def probs_of(head: ThingHead, cells: torch.Tensor) -> torch.Tensor:
    return torch.cat([head.logits_from_cells(cells[i : i + 512].float()).sigmoid() for i in range(0, len(cells), 512)])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--train-frames", type=int, default=12000)
    p.add_argument("--eval-frames", type=int, default=1500, help="frames of val, of test, and of test at held-out sizes")
    p.add_argument("--hidden", type=int, default=96)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--weight-decay", type=float, default=1e-2)
    p.add_argument("--dropout", type=float, default=0.3)
    p.add_argument("--extra-frames", type=int, default=800,
                   help="more training frames over HEAD_EXTRA_PHOTOS (tinyvlm/drawn.py), with the same mixture of things")
    p.add_argument("--colourful-frames", type=int, default=0,
                   help="more training frames over COLOURFUL_TRAIN_PHOTOS (tinyvlm/drawn.py), the same mixture of things")
    p.add_argument("--without-shape-drawings", action="store_true",
                   help="leave out training frames over SHAPE_DRAWINGS (photographs of coloured squares, tinyvlm/drawn.py)")
    p.add_argument("--cell-weight", type=float, default=0.0,
                   help="weight of the cell-level loss (cell_targets: where each thing was drawn) beside the frame's")
    p.add_argument("--max-false", type=float, default=0.005, help="false-word rate the threshold must keep on val")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--feature-cache", type=Path, default=None)
    p.add_argument("--out", type=Path, required=True, help="directory for things.safetensors and things-head.json")
    args = p.parse_args(argv)

    from videokv_node.models.efficientnet_lite import load_efficientnet_lite0
    from videokv_node.models.videokv_tiny import Projector
    from videokv_node.tinyvlm.drawn_features import colour_cells, encode_drawn

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t0 = time.monotonic()
    extra = DrawnSampler("train", args.seed + 9, sources=((), HEAD_EXTRA_PHOTOS)).frames(args.extra_frames)
    extra += DrawnSampler("train", args.seed + 11, sources=((), COLOURFUL_TRAIN_PHOTOS)).frames(args.colourful_frames)
    train = DrawnSampler("train", args.seed).frames(args.train_frames)  # the same specs with or without the drawings
    if args.without_shape_drawings:
        train = [f for f in train if f.source not in SHAPE_DRAWINGS]
    sets = {
        "train": train + extra,
        "val": DrawnSampler("val", args.seed + 1).frames(args.eval_frames),
        "test": DrawnSampler("test", args.seed + 2).frames(args.eval_frames),
        "test_held_out_sizes": DrawnSampler("test", args.seed + 3, held_out_sizes=True).frames(args.eval_frames),
    }
    encoder = load_efficientnet_lite0()
    head = ThingHead(hidden=args.hidden)
    head.drop.p = args.dropout
    projector = Projector(576, colour_stats=True)  # only its pooling is used (no weights): the LM stage's features
    feats = encode_drawn(args.feature_cache, encoder, head, projector, [f for v in sets.values() for f in v], log=print)
    t_enc = time.monotonic() - t0
    cells = {k: torch.cat([torch.stack([feats[f]["cells"] for f in v]), colour_cells(head, v).half()], -1)
             for k, v in sets.items()}
    curve, val_curve = fit(head, cells["train"], targets(sets["train"]), args.steps, args.batch, args.lr, args.seed,
                           args.weight_decay, (cells["val"], sets["val"]),
                           cells_y=cell_targets(sets["train"], head.grid) if args.cell_weight > 0 else None,
                           cell_weight=args.cell_weight)
    head.drop.p = 0.0
    probs = {k: probs_of(head, c) for k, c in cells.items()}
    threshold = pick_threshold(probs["val"], sets["val"], args.max_false)
    report = {
        "what": "videokv-tiny v6 drawn-things head (models/things_head.py) on tinyvlm/drawn.py frames",
        "command": " ".join(["python -m videokv_node.tinyvlm.train_things_head", *(sys.argv[1:] if argv is None else argv)]),
        "seed": args.seed, "hidden": args.hidden, "steps": args.steps, "batch": args.batch, "lr": args.lr,
        "weight_decay": args.weight_decay, "dropout": args.dropout, "extra_frames": args.extra_frames,
        "colourful_frames": args.colourful_frames, "cell_weight": args.cell_weight, "without_shape_drawings": args.without_shape_drawings,
        "val_curve": val_curve, "picked_step": max(val_curve, key=lambda x: x[1])[0] if val_curve else args.steps,
        "frames": {k: len(v) for k, v in sets.items()}, "threshold": threshold, "max_false": args.max_false,
        "loss_curve": curve, "encode_s": round(t_enc), "wall_s": round(time.monotonic() - t0),
        "scores": {k: score(probs[k], sets[k], threshold) for k in sets},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, args.out / HEAD_FILE)
    (args.out / "things-head.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["scores"], indent=1))


if __name__ == "__main__":
    main()
