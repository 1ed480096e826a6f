"""videokv-tiny on single frames of held-out footage with one coloured shape drawn in (issue 43).

    python -m bench.drawn_frames                 # 120 frames of the test split, written to docs/bench/drawn.md
    python -m bench.drawn_frames --split val --out -

Each frame (``tinyvlm/drawn.py``: a view of a clip or photograph of the split, one shape of a side from a fifth of
the frame's height up, filmed) goes alone into a ``full`` memory, and the model is asked, in the hour's wordings
(``eval/hour_questions.py``, which training never uses), the shape's colour and the coloured thing's shape: as
multiple choice scored by likelihood (the node's default) and open (greedy answer, right when it names the right
colour or shape and no other). Beside them, the words the frame's block carries (the things head's, the noun
block's first slot): what ``~/locate`` and retrieval find it by; and the colour choice split by whether those words
name the thing (on val, 2026-11-29: right in 164 of 165 frames whose words name it, 14 of 35 where they do not: the
decoder reads a colour from the words). Every figure with its 95% Wilson interval.

``--context K``: the frame goes in among K frames of the split's footage with nothing drawn (the needle at a random
place), all in the ``full`` memory, as a question's context holds the needle among other frames. The gap between
K = 0 and K = 8 is what issue 43 found: the words name the thing, the decoder reads it alone, and among eight real
frames it answers another colour.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from bench import report
from bench.accuracy import load_model
from bench.long_stream_report import wilson
from bench.machine import describe
from bench.report import log
from videokv_node.memory import Frame, GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.tinyvlm.drawn import DrawnSampler, render_drawn
from videokv_node.tinyvlm.scenes import COLOURS, SHAPES

REPO = Path(__file__).resolve().parent.parent
DOC = "docs/bench/drawn.md"
BEGIN, END = "<!-- BEGIN drawn frames -->", "<!-- END drawn frames -->"


def _named(answer: str, right: str, values) -> bool:
    words = answer.lower().replace(".", " ").replace(",", " ").split()
    return right in words and not any(v in words for v in values if v != right)


def run(model: str, split: str, n: int, seed: int, held_out_sizes: bool, context: int = 0) -> dict:
    adapter = load_model(model)
    sampler = DrawnSampler(split, seed, held_out_sizes=held_out_sizes)
    counts = {k: [] for k in ("colour choice", "shape choice", "colour open", "shape open", "words name it",
                              "colour choice, the words name it", "colour choice, they do not")}
    T, sink = adapter.tokens_per_frame, len(adapter.prefix_ids())
    for i in range(n):
        spec = sampler.frame(n_things=1)
        thing = spec.things[0]
        specs = [sampler.frame(n_things=0) for _ in range(context)]
        at = int(sampler.rng.integers(context + 1))
        specs.insert(at, spec)
        engine = VideoMemoryEngine(adapter, MemoryConfig(policy="full", budget_tokens=sink + (context + 4) * T,
                                                         local_window_tokens=(context + 1) * T),
                                   GenerationConfig(max_new_tokens=6))
        engine.ingest([Frame("/camera", (i * (context + 1) + j + 1) * 10**9, render_drawn(f)) for j, f in enumerate(specs)])
        words = [b.words for b in engine.store.blocks()][at]  # what the memory keeps of the needle's word block
        counts["words name it"].append(thing.name in words)
        for kind, q, right, values in (("colour", f"Which colour did the {thing.shape} have?", thing.colour, tuple(COLOURS)),
                                       ("shape", f"What shape was the {thing.colour} thing?", thing.shape, SHAPES)):
            a = engine.ask(Question(q, options=list(values)), option_scoring="likelihood")
            counts[f"{kind} choice"].append(values[a.option_index] == right)
            if kind == "colour":  # what the decoder reads a colour from: the words, or the visual tokens alone
                counts["colour choice, the words name it" if thing.name in words else "colour choice, they do not"].append(
                    values[a.option_index] == right)
            counts[f"{kind} open"].append(_named(engine.ask(Question(q)).text, right, values))
        engine.close()
        if (i + 1) % 20 == 0:
            log(f"  {i + 1}/{n} frames")
    return counts


def render(counts: dict, info: dict) -> str:
    rows = []
    for k, v in counts.items():
        lo, hi = wilson(sum(v), len(v))
        rows.append([k, f"{sum(v)}/{len(v)} = {sum(v) / max(1, len(v)):.0%} [{lo:.0%}, {hi:.0%}]"])
    return "\n\n".join([f"### {info['title']}", info["run"], report.table(["measure", "right [95% Wilson]"], rows)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.drawn_frames", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="videokv-tiny")
    p.add_argument("--split", default="test", choices=("val", "test"))
    p.add_argument("--frames", type=int, default=120)
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--held-out-sizes", action="store_true", help="sides only of tinyvlm/drawn.py HELD_OUT_SIDES")
    p.add_argument("--context", type=int, default=0, help="frames of the split with nothing drawn around the needle")
    p.add_argument("--out", default=DOC)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    machine = describe(REPO)
    t0 = time.perf_counter()
    if args.context < 0:
        p.error("--context must be 0 or more")
    counts = run(args.model, args.split, args.frames, args.seed, args.held_out_sizes, args.context)
    title = (f"{args.model}, {args.split} footage, one shape a frame" + (", held-out sizes" if args.held_out_sizes else "")
             + (f", among {args.context} other frames" if args.context else ""))
    info = {"title": title, "run": report.run_table(machine, 1, report.command_line("python -m bench.drawn_frames", argv),
                                                    time.perf_counter() - t0, __import__("os").getloadavg())}
    tag = f"{args.split}{'-sizes' if args.held_out_sizes else ''}{f'-context{args.context}' if args.context else ''}"
    report.publish(render(counts, info), args.out, REPO, BEGIN.replace("frames", f"frames {tag}"),
                   END.replace("frames", f"frames {tag}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
