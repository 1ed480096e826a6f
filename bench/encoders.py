"""A stronger frozen encoder, measured against Lite0 before it is adopted (issue 43): what each EfficientNet-Lite's
maps give the drawn-things head.

    python -m bench.encoders                    # lite0, lite1, lite2; written to docs/bench/encoders.md
    python -m bench.encoders --variants lite0,lite2 --train-frames 1200 --out -

Why this and not a retrained model: what an encoder changes first is what can be read from its maps, and the head
(``models/things_head.py``: per cell of a 7 x 7 grid, the final and fourth-stage maps and the cell's colour
statistics, a two-layer MLP, the strongest cell) is the reader that is cheap to train: it is where ``~/locate``
and retrieval find a drawn thing (its words) and, as a frame's word block, much of what the decoder answers a
colour from. A retrained decoder on another encoder is hours of training per candidate; this is minutes, and
a candidate that reads no better here is not worth them.

Method, the same for every encoder: one seeded set of ``tinyvlm/drawn.py`` frames (train: the train split's
footage plus ``HEAD_EXTRA_PHOTOS``; val; test: held-out footage; test at held-out sizes), each encoder at its own
input size (224, 240, 260 px), its maps average-pooled to the same 7 x 7 cells (so the head and the grid are the
same; only what the maps hold differs), the head trained as ``tinyvlm/train_things_head.py`` trains the shipped one
(its ``fit``, the checkpoint best on val, the threshold from val) with the same seed and steps, then scored on test
by that module's ``score``. Fewer training frames than the shipped head's 6,800 by default (the encoders are run on
2 busy cores here), so the absolute figures sit below the shipped head's: compare the rows with each other. The
encoder's time per frame is measured in the same run (maps only, one thread), so the ratios hold on a noisy machine.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bench import report
from bench.long_stream_report import wilson
from bench.machine import describe
from bench.report import log
from videokv_node.models.efficientnet_lite import FEATURE_DIM, VARIANTS, load_efficientnet_lite, normalise
from videokv_node.models.things_head import ThingHead
from videokv_node.tinyvlm.drawn import HEAD_EXTRA_PHOTOS, DrawnSampler
from videokv_node.tinyvlm.drawn_features import colour_cells, render_frame
from videokv_node.tinyvlm.train_things_head import fit, pick_threshold, probs_of, score, targets

REPO = Path(__file__).resolve().parent.parent
DOC = "docs/bench/encoders.md"
BEGIN, END = "<!-- BEGIN encoders -->", "<!-- END encoders -->"


def frame_sets(seed: int, train: int, extra: int, evaluate: int) -> dict[str, list]:
    """The seeded frames every encoder reads: as ``train_things_head`` draws them, at this bench's sizes."""
    return {
        "train": DrawnSampler("train", seed).frames(train)
        + DrawnSampler("train", seed + 9, sources=((), HEAD_EXTRA_PHOTOS)).frames(extra),
        "val": DrawnSampler("val", seed + 1).frames(evaluate),
        "test": DrawnSampler("test", seed + 2).frames(evaluate),
        "test_held_out_sizes": DrawnSampler("test", seed + 3, held_out_sizes=True).frames(evaluate),
    }


@torch.inference_mode()
def encode_cells(variants: list[str], sets: dict[str, list], batch: int = 32) -> dict[str, tuple[dict, float, int]]:
    """Per encoder, per split the head's cells (F, 49, in_dim) float16 from its maps, its encoder seconds a frame and
    its parameter count. Each frame is rendered once and read by every encoder (the renders are most of the time)."""
    nets = {v: load_efficientnet_lite(v) for v in variants}
    pool = ThingHead()  # only its pooling to cells (map_cells, colour_cells), which reads no weight and any map width
    parts: dict[str, dict[str, list]] = {v: {k: [] for k in sets} for v in variants}
    enc_s = dict.fromkeys(variants, 0.0)
    n = 0
    for split, frames in sets.items():
        for start in range(0, len(frames), batch):
            chunk = frames[start : start + batch]
            rgb = torch.from_numpy(np.stack([render_frame(f) for f in chunk])).permute(0, 3, 1, 2).float() / 255.0
            colour = colour_cells(pool, chunk)
            for v, net in nets.items():
                pixels = F.interpolate(rgb, size=(net.image_size,) * 2, mode="bilinear", antialias=True, align_corners=False)
                t0 = time.perf_counter()
                maps, mid = net.feature_levels(normalise(pixels))
                enc_s[v] += time.perf_counter() - t0
                parts[v][split].append(torch.cat([pool.map_cells(maps, mid), colour], -1).half())
            n += len(chunk)
        log(f"  {split} encoded by {', '.join(variants)} ({len(frames)} frames)")
    return {v: ({k: torch.cat(x) for k, x in parts[v].items()}, enc_s[v] / max(1, n),
                sum(p.numel() for p in nets[v].parameters())) for v in variants}


def measure(variant: str, sets: dict[str, list], cells: dict, per_frame_s: float, params: int, steps: int, seed: int) -> dict:
    """One encoder's row: the head trained on its cells (the shipped head's settings), scored per split."""
    spec = VARIANTS[variant]
    torch.manual_seed(seed)
    head = ThingHead(hidden=96, feature_dim=FEATURE_DIM, mid_dim=spec.mid_dim())
    head.drop.p = 0.3
    curve, _ = fit(head, cells["train"], targets(sets["train"]), steps, 256, 2e-3, seed, 1e-2,
                   (cells["val"], sets["val"]), log=log)
    head.drop.p = 0.0
    probs = {k: probs_of(head, c) for k, c in cells.items()}
    threshold = pick_threshold(probs["val"], sets["val"], 0.005)
    return {"variant": variant, "image_size": spec.image_size, "encode_ms": 1000 * per_frame_s,
            "params": params,
            "threshold": threshold, "loss": curve[-1][1] if curve else None,
            "scores": {k: score(probs[k], sets[k], threshold) for k in sets}, "frames": {k: len(v) for k, v in sets.items()}}


def _share(x: float | None, n: int) -> str:
    """A share of ``n`` with its 95% Wilson interval ("-" when none)."""
    if x is None or n == 0:
        return "-"
    k = round(x * n)
    lo, hi = wilson(k, n)
    return f"{x:.2f} [{lo:.2f}, {hi:.2f}]"


def render(rows: list[dict], info: str) -> str:
    base = rows[0]
    table = []
    for r in rows:
        t, s = r["scores"]["test"], r["scores"]["test_held_out_sizes"]
        small = t["named_by_side"]["0.00-0.28"]
        n_small = sum(1 for f in r["_test"] for th in f.things if th.side < 0.28)
        table.append([
            f"{r['variant']} ({r['image_size']} px, {r['params'] / 1e6:.1f}M)",
            _share(t["single_named"], t["single_frames"]), _share(t["single_colour"], t["single_frames"]),
            _share(t["single_shape"], t["single_frames"]), _share(small, n_small),
            _share(s["single_named"], s["single_frames"]),
            _share(t["false_word_rate"], t["frames_without_things"]),
            f"{r['scores']['val']['single_named']:.2f}", f"{r['threshold']:.2f}",
            f"{r['encode_ms']:.0f} ({r['encode_ms'] / base['encode_ms']:.2f}x)",
        ])
    head = ["encoder", "test: one shape named", "its colour", "its shape", "shapes under 28% of the height named",
            "held-out sizes named", "frames with nothing drawn given a word", "val named", "threshold (val)",
            "encoder ms a frame (x lite0)"]
    return "\n\n".join(["### The drawn-things head on each encoder's maps (test split unless said)", info,
                        report.table(head, table)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.encoders", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variants", default="lite0,lite1,lite2", help=f"comma-separated, the first is the base: {', '.join(VARIANTS)}")
    p.add_argument("--train-frames", type=int, default=2400)
    p.add_argument("--extra-frames", type=int, default=400)
    p.add_argument("--eval-frames", type=int, default=600)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=DOC)
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in variants if v not in VARIANTS]
    if not variants or unknown:
        p.error(f"--variants: unknown {unknown or 'none given'}; choose from {', '.join(VARIANTS)}")
    torch.set_num_threads(1)
    machine = describe(REPO)
    t0 = time.perf_counter()
    sets = frame_sets(args.seed, args.train_frames, args.extra_frames, args.eval_frames)
    log(f"encoding {sum(map(len, sets.values()))} frames with {', '.join(variants)}")
    encoded = encode_cells(variants, sets)
    rows = []
    for v in variants:
        log(f"{v}: the head ({args.steps} steps)")
        cells, per_frame_s, params = encoded.pop(v)
        rows.append(measure(v, sets, cells, per_frame_s, params, args.steps, args.seed) | {"_test": sets["test"]})
    info = report.run_table(machine, 1, report.command_line("python -m bench.encoders", argv), time.perf_counter() - t0,
                            os.getloadavg())
    report.publish(render(rows, info), args.out, REPO, BEGIN, END)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
