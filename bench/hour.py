"""A robot's hour: every memory policy on hour streams of real footage (issue 32).

    python -m bench.hour                                   # 1,800 frames, robot preset, 1/2/5%, 4 streams
    python -m bench.hour --frames 600,3600 --span lengths  # other lengths, their own section of hour.md
    python -m bench.hour --budgets 0.02 --out -            # the goal's cell only, printed
    make bench-hour                                        # the goal's cell: robot preset, 2%, 1,800 frames
                                                           # (the Makefile's help names the other parts)

Streams: ``eval/hour_stream.py`` (real clips and photographs composed into moving and still
stretches and revisits, five things shown once or a few times), questions ``eval/hour_questions.py``
(halfway and at the end: colour, shape, number, order, after, count) and one ``~/locate`` query per
thing (top 3 after the last frame); and held-out real photographs glimpsed once each (``--real-things``,
by default ``HOUR_REAL_THINGS``), their ``~/locate`` in a column of its own. videokv-tiny (6 tokens a frame), float32 on the CPU.

Rows (``bench/hour_rows.py``): the ceiling (the things' frames and 4 others only, full attention:
what the model reads when nothing is far away), ``full`` where the model's positions hold the
stream, and per budget: recency (``full`` keeping the last k frames), the node's default, and every
policy under each preset. All rows of a stream are fed its frames in lockstep, so a frame is made
and encoded once (``CachedVision``); each row's ingest is timed alone.

Per row: accuracy with its 95% Wilson interval and by kind; needle recall (every appearance a
question rests on attended in some layer: one frame of it is enough; and the mean share over
layers); ``~/locate`` top-1/top-3 hit (a returned frame shows the thing) and the time error of
"when did you last see it" (the latest of the top 3 against the last appearance); TTFT p50/p95;
ingest ms per frame over the first and the last 10% of the stream; resident and offloaded bytes
at the end (median over streams).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from bench import report
from bench.accuracy import POLICIES, load_model
from bench.hour_report import DOC, SPANS, render, span_markers
from bench.hour_rows import (HOUR_POLICIES, CachedVision, Row, engine_bytes, engine_key, group_recall, plan_rows, real_things_arg,
                             names_option, row_config, shipped_variants, switch_row)
from bench.long_stream import CEILING_DISTRACTORS
from bench.machine import describe
from bench.report import log
from videokv_node.eval.footage import FootageLibrary
from videokv_node.eval.hour_questions import hour_questions, locate_truths
from videokv_node.eval.hour_stream import make_hour_stream
from videokv_node.memory import Frame, GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.memory.config import ConfigError
from videokv_node.memory.questions.locate import LocateQuery

REPO = Path(__file__).resolve().parent.parent
THREADS = 1
LOCATE_TOP_K = 3


def _frame(stream, i: int, rgb) -> Frame:
    return Frame("/camera", round(stream.stamp(i) * 1e9), rgb)


def ask(engine: VideoMemoryEngine, stream, q, row: Row) -> None:
    answer = engine.ask(Question(q.question, options=list(q.choices)), option_scoring="likelihood")
    # A still span (issue 36) stands for every frame from its stamp to its last one.
    spans = [(stream.index_of(e.stamp_ns), stream.index_of(e.last)) for e in answer.evidence]
    attended = {f for a, b in spans for f in range(a, b + 1)}
    layers = [{stream.index_of(s) for s in layer} for layer in engine.last_layer_stamps]
    found, share = group_recall(q.evidence, attended, layers)
    row.correct.append(answer.option_index == q.answer)
    # What the answer read: its frames (first, last of each evidence span) and their footage's sources, so a wrong
    # answer can be traced to what shared its context (a clip's bow tie named "red triangle", 2026-11-29).
    row.details.append(dict(row=row.label, stream=stream.video_id, question=q.question, kind=q.kind,
                            chosen=answer.option_index, answer=q.answer, found=found,
                            needles=[sorted(g) for g in q.evidence], context=[list(s) for s in sorted(spans)],
                            sources=sorted({stream.shot_of(f).source for f in attended})))
    row.kinds.append(q.kind)
    row.found.append(found)
    row.layer_share.append(share)
    row.ttft_s.append(answer.ttft_s)
    if row.open:
        said = engine.ask(Question(q.question)).text
        row.open_correct.append(names_option(said, q.choices[q.answer], q.choices))
        row.details[-1]["open"] = said


def locate(engine: VideoMemoryEngine, stream, truths, row: Row) -> None:
    """``locate_truths``: the shapes' first (the main columns), then the real things' (``locate_real_top3``)."""
    for k, t in enumerate(truths):
        moments = engine.locate(LocateQuery(t.query, top_k=LOCATE_TOP_K)).moments
        shown = {f for app in t.appearances for f in app}
        spans = [range(stream.index_of(m.stamp_ns), stream.index_of(m.last_stamp_ns or m.stamp_ns) + 1) for m in moments]
        hit = any(f in shown for s in spans for f in s)
        row.details.append(dict(row=row.label, stream=stream.video_id, locate=t.query, real=k >= len(stream.things),
                                returned=[[s[0], s[-1]] for s in spans], shown=sorted(shown), hit=hit))
        if k >= len(stream.things):
            row.locate_real_top3.append(hit)
            continue
        got = [s[-1] for s in spans]  # "when did you last see it": a still span's last frame
        row.locate_top1.append(bool(spans) and any(f in shown for f in spans[0]))
        row.locate_top3.append(hit)
        row.locate_error_s.append(abs(max(got) - t.last_frame) * stream.period_s if got else float("inf"))


def run_ceiling(adapter, stream, questions, truths, row: Row, T: int, sink: int) -> None:
    """The things' frames and the first CEILING_DISTRACTORS others, full attention, asked at the same moments."""
    shown = sorted({f for a in stream.appearances + stream.real_appearances for f in a.frames})
    others = [i for i in range(stream.n_frames) if i not in shown][:CEILING_DISTRACTORS]
    keep = sorted(shown + others)
    row.frames = len(keep)
    cfg = row_config(Row("", "full", "robot", 1.0), len(keep), T, sink)
    engine = VideoMemoryEngine(adapter, cfg, GenerationConfig())
    pending = list(questions)
    for i in keep:
        while pending and pending[0].ask_after < i:
            ask(engine, stream, pending.pop(0), row)
        engine.ingest([_frame(stream, i, stream.frame(i))])
    for q in pending:
        ask(engine, stream, q, row)
    locate(engine, stream, truths, row)
    engine.close()


def run_stream(adapter, stream, rows: list[Row]) -> None:
    """Every row over one stream, fed in lockstep; the rows' lists grow by this stream's questions."""
    n, T, sink = stream.n_frames, adapter.tokens_per_frame, len(adapter.prefix_ids())
    questions, truths = hour_questions(stream), locate_truths(stream)
    engines: dict[str, tuple[VideoMemoryEngine, MemoryConfig, list[Row]]] = {}
    for row in rows:
        if row.policy == "ceiling":
            run_ceiling(adapter, stream, questions, truths, row, T, sink)
            continue
        cfg = row_config(row, n, T, sink)
        if (key := engine_key(cfg)) not in engines:
            engines[key] = (VideoMemoryEngine(adapter, cfg, GenerationConfig()), cfg, [])
        engines[key][2].append(row)
    first, last = max(1, n // 10), n - max(1, n // 10)
    pending = list(questions)
    t0 = time.perf_counter()
    for i in range(n if engines else 0):  # the ceiling alone (--policies '' --without ...) needs no pass over the stream
        frame = _frame(stream, i, stream.frame(i))
        adapter.encode_frames([frame.rgb])  # the one vision encoding; every row below hits the cache
        for engine, _, served in engines.values():
            t = time.perf_counter()
            engine.ingest([frame])
            ms = (time.perf_counter() - t) * 1e3
            for row in served:
                (row.ingest_first_ms if i < first else row.ingest_last_ms if i >= last else []).append(ms)
                (row.ingest_still_ms if stream.shot_of(i).kind == "still" else row.ingest_moving_ms).append(ms)
        while pending and pending[0].ask_after == i:
            q = pending.pop(0)
            for engine, cfg, served in engines.values():
                for row in served:
                    if len(served) > 1:
                        switch_row(engine, row_config(row, n, T, sink))
                    ask(engine, stream, q, row)
        if (i + 1) % 300 == 0:
            log(f"    {stream.video_id}: {i + 1}/{n} frames, {time.perf_counter() - t0:.0f} s")
    for engine, cfg, served in engines.values():
        for row in served:
            if len(served) > 1:
                switch_row(engine, row_config(row, n, T, sink))
            locate(engine, stream, truths, row)
            resident, offloaded = engine_bytes(engine)
            row.bytes_resident.append(resident)
            row.bytes_offloaded.append(offloaded)
            row.encoder_calls.append(engine.stats().frames_ingested - engine.stats().frames_merged)
        engine.close()


def run_part(model: str, n: int, seeds: list[int], rows: list[Row], library: FootageLibrary | str | None = None,
             real_things: tuple[str, ...] = ()) -> list[Row]:
    """One worker's streams (a process of its own with ``--workers``: ``library`` is then the footage split's name,
    '' for every source); returns ``rows`` filled."""
    torch.set_num_threads(THREADS)
    if not isinstance(library, FootageLibrary):
        library = FootageLibrary.load(split=library or None)
    adapter = load_model(model)
    adapter.set_vision_backend(CachedVision(adapter.vision_backend))
    for seed in seeds:
        t0 = time.perf_counter()
        run_stream(adapter, make_hour_stream(f"hour{n}-{seed}", n, seed, library, real_things=real_things), rows)
        log(f"  {n} frames, stream seed {seed}: {time.perf_counter() - t0:.0f} s")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hour", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="videokv-tiny", help="videokv-tiny, videokv-tiny-random or a videokv-tiny "
                        "weights directory (a candidate: its manifest.json)")
    parser.add_argument("--frames", default="1800", help="comma-separated stream lengths, sampled frames 2 s apart")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="the first stream's seed; stream j has seed + j")
    parser.add_argument("--budgets", default="0.01,0.02,0.05")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--presets", default="robot")
    parser.add_argument("--without", default="", help="comma-separated rows left out: ceiling, shipped (the node's "
                        "defaults as shipped), full, recency, default")
    parser.add_argument("--shipped-with", default="", help="rows of the node's shipped defaults with other values, as "
                        "a params file would set them: ';'-separated sets of NAME=VALUE ('memory.local_window_tokens=216 "
                        "memory.retrieve_frames=18; memory.local_window_tokens=288'): the candidates a default is chosen among")
    parser.add_argument("--open", action="store_true", help="also ask every question without its options (greedy "
                        "answer, right when it names the right option and no other): open answers against choice")
    parser.add_argument("--workers", type=int, default=1, help="processes sharing the streams (one torch thread each)")
    parser.add_argument("--real-things", help="comma-separated held-out real photographs "
                        "glimpsed once each (tinyvlm/things_heldout.py sources; default: eval/hour_stream.py HOUR_REAL_THINGS "
                        "where opencv-doc's photographs are unpacked; '' for none); their ~/locate in its own column")
    parser.add_argument("--footage", default="test", help="the footage's split (eval/footage.py FOOTAGE_SPLITS): 'test', "
                        "sources videokv-tiny never trained on (issue 43), or '' for every source (the runs before v6)")
    parser.add_argument("--details", type=Path, help="also write one JSON line per row and question (its answer, the needles' "
                        "frames, the frames it read and their sources), and per row and ~/locate query, to this file")
    parser.add_argument("--out", default=DOC, help="markdown file to update; '-' prints the section")
    parser.add_argument("--span", choices=tuple(SPANS), default="main", help="which generated span of --out this part of "
                        "the grid writes: " + "; ".join(f"{k}: {v}" for k, v in SPANS.items()).replace("%", "%%"))
    args = parser.parse_args(argv)
    budgets = tuple(float(b) for b in args.budgets.split(","))
    policies = tuple(p for p in args.policies.split(",") if p)
    presets = tuple(p for p in args.presets.split(",") if p)
    without = frozenset(w for w in args.without.split(",") if w)
    real = real_things_arg(args.real_things)
    try:
        shipped_with = shipped_variants(args.shipped_with)
    except (ConfigError, ValueError) as exc:
        parser.error(f"--shipped-with: {exc}")
    if not set(policies) <= set(POLICIES + HOUR_POLICIES) or not all(0 < b < 1 for b in budgets):
        parser.error(f"--policies must be a subset of {POLICIES + HOUR_POLICIES} and --budgets shares in (0, 1)")
    command = "python -m bench.hour" + "".join(f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv))
    machine = describe(REPO)
    torch.set_num_threads(THREADS)
    library = FootageLibrary.load(split=args.footage or None)
    probe = load_model(args.model)
    T, sink, max_pos = probe.tokens_per_frame, len(probe.prefix_ids()), probe.max_positions
    del probe
    t0 = time.perf_counter()
    results = {}
    for n in (int(x) for x in args.frames.split(",")):
        rows, skipped = plan_rows(n, T, sink, max_pos, policies, presets, budgets, without, tuple(shipped_with))
        for row in rows:
            row.open = args.open
        seeds = [args.seed + j for j in range(args.streams)]
        if args.workers > 1:
            import multiprocessing

            parts = [seeds[w::args.workers] for w in range(args.workers) if seeds[w::args.workers]]
            with multiprocessing.get_context("spawn").Pool(len(parts)) as pool:
                done = pool.starmap(run_part, [(args.model, n, part, rows, args.footage, real) for part in parts])
            rows = done[0]
            for other in done[1:]:
                for into, row in zip(rows, other, strict=True):
                    for name in Row.MERGED:
                        getattr(into, name).extend(getattr(row, name))
        else:
            rows = run_part(args.model, n, seeds, rows, library, real)
        results[n] = (rows, skipped)
    info = dict(machine=machine, command=command, niceness=os.nice(0), wall_s=time.perf_counter() - t0,
                load_end=os.getloadavg(), model=args.model, streams=args.streams, seed=args.seed,
                library=library.names, threads=THREADS, real=", ".join(real), span=args.span)
    section = render(results, info)
    if args.details:
        with open(args.details, "w") as f:
            for n, (rows, _) in results.items():
                for r in rows:
                    for d in r.details:
                        f.write(json.dumps(dict(frames=n, **d)) + "\n")
    report.publish(section, args.out, REPO, *span_markers(args.span))
    return 0


if __name__ == "__main__":
    sys.exit(main())
