"""Benchmarks of the videokv memory engine on this machine; results go to docs/bench/ (engine.md, memory.md, vision.md).

    python -m bench.run                  # everything (about 9 minutes on 2 CPU cores)
    python -m bench.run --quick          # short run (about 1-2 minutes), same tables
    python -m bench.run --part engine    # parts 1-3 only
    python -m bench.run --part memory    # the memory-policy comparison only
    python -m bench.run --part vision    # vision backends: torch vs onnxruntime (vs TensorRT on a GPU)
    make bench                           # everything, after setting up the environment
    make bench-memory                    # --part memory, after setting up the environment
    make bench-vision                    # --part vision, after setting up the environment

Four parts, all seeded and measured with time.perf_counter (warm-up excluded).
The engine parts (``--part engine``):
1. the tiny model, policies full and rekv: ingest latency, question TTFT and
   memory footprint at several memory sizes;
2. the LLaVA-OneVision-0.5B geometry with random weights (nothing downloaded):
   vision and decoder cost per frame, KV bytes per frame, question TTFT;
3. the memory bound over a long tiny stream: peaks against the caps (fails the
   run if a cap is ever exceeded).
And ``--part memory``: every policy (full, rekv, streamkv, hermes, mukv, rekv with
TGV-KV) on the same stream under the same budget, as ratios to full and rekv at
several stream lengths (``bench/memory_policies.py``). And ``--part vision``: per-frame
latency of LLaVA-OneVision-0.5B's vision path through each vision backend
(``bench/vision_backends.py``; a few minutes on 2 CPU cores).

Each of the three writes its own span of its own page of docs/bench/ (or of --out), between
its own markers; the rest of the file is left as it is.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from videokv_node.models.llava_onevision import LlavaOnevisionAdapter

from bench import bound, memory_policies, memory_report, real_size, report, tiny, vision_backends
from bench.machine import Machine, describe
from bench.report import Run, log, render, update_document

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class Plan:
    """How much of each part to run."""

    memory_sizes: tuple[int, ...]  # part 1: frames in memory per case
    measured_frames: int  # part 1: frames timed per case, after memory is full
    tiny_repeats: int  # part 1: timed repeats of each question
    real_frames: int  # part 2: frames streamed through the real-size model
    real_repeats: int  # part 2: timed repeats of each question
    bound_frames: int  # part 3: frames streamed per policy
    memory_lengths: tuple[int, ...]  # memory part: checkpoints of the stream, frames streamed
    memory_repeats: int  # memory part: timed repeats of each question per checkpoint


FULL = Plan(memory_sizes=(50, 200, 1000), measured_frames=200, tiny_repeats=10,
            real_frames=24, real_repeats=3, bound_frames=5000,
            memory_lengths=(100, 300, 1000, 3000), memory_repeats=10)
QUICK = Plan(memory_sizes=(50, 200), measured_frames=50, tiny_repeats=5,
             real_frames=3, real_repeats=1, bound_frames=1000,
             memory_lengths=(100, 300), memory_repeats=3)
POLICIES = ("full", "rekv")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer frames and repeats (about 1-2 minutes)")
    parser.add_argument(
        "--part", choices=("all", "engine", "memory", "vision"), default="all",
        help="engine: parts 1-3 (tiny model, memory bound, real-size model); memory: the policy comparison; "
             "vision: the vision backends",
    )
    parser.add_argument(
        "--out", default=None,
        help="markdown file whose results sections are rewritten (relative to the repo root); '-' prints them; "
             "default: each part's own page of docs/bench/",
    )
    parser.add_argument("--json", default=None, help="also write every measurement as JSON to this path")
    parser.add_argument("--seed", type=int, default=0, help="seed of the models' weights and the synthetic scene")
    return parser.parse_args(argv)


def run_tiny(plan: Plan, seed: int) -> tuple[list[tiny.TinyCase], LlavaOnevisionAdapter]:
    adapter = LlavaOnevisionAdapter.tiny(seed=seed)
    cases = []
    for policy in POLICIES:
        for n in plan.memory_sizes:
            t0 = time.perf_counter()
            cases.append(tiny.run_case(adapter, policy, n, plan.measured_frames, plan.tiny_repeats, seed))
            log(f"  {policy}, {n} frames in memory: {time.perf_counter() - t0:.1f} s")
    return cases, adapter


def run_bound(adapter: LlavaOnevisionAdapter, plan: Plan, seed: int) -> list[bound.BoundResult]:
    return [bound.run(adapter, policy, plan.bound_frames, seed) for policy in POLICIES]


class Parts:
    """Wall time (perf_counter) and this process's CPU time (process_time) of each part, by name."""

    def __init__(self) -> None:
        self.wall_s: dict[str, float] = {}
        self.cpu_s: dict[str, float] = {}

    def run(self, name: str, fn, *args):
        log(f"{name} ...")
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn(*args)
        self.wall_s[name] = time.perf_counter() - t0
        self.cpu_s[name] = time.process_time() - c0
        log(f"{name}: {self.wall_s[name]:.0f} s wall, {self.cpu_s[name]:.0f} s CPU")
        return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan = QUICK if args.quick else FULL
    torch.manual_seed(args.seed)
    machine = describe(REPO)
    if machine.load_start[0] > machine.cores:
        log(f"warning: load average {machine.load_start[0]:.2f} on {machine.cores} cores; timings will be inflated")
    command = "python -m bench.run" + "".join(f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv))
    record: dict = {}
    adapter = None
    if args.part in ("all", "engine"):
        result, adapter = run_engine_parts(plan, args, machine, command)
        emit(page(args.out, report.DOC), render(result), update_document)
        record.update(asdict(result))
    if args.part in ("all", "memory"):
        adapter = adapter or LlavaOnevisionAdapter.tiny(seed=args.seed)
        at_start = describe(REPO) if args.part == "all" else machine  # this part's own date and load
        parts = Parts()
        measured = parts.run(
            "memory policies", memory_policies.measure, adapter, plan.memory_lengths, plan.memory_repeats, args.seed, log
        )
        info = memory_report.RunInfo(
            command=command, quick=args.quick, seed=args.seed, machine=at_start, load_end=os.getloadavg(),
            wall_s=parts.wall_s["memory policies"], cpu_s=parts.cpu_s["memory policies"],
        )
        emit(page(args.out, memory_policies.DOC), memory_report.render(measured, info), memory_policies.update_document)
        record["memory"] = asdict(measured)
    if args.part in ("all", "vision"):
        log("vision backends ...")
        vision = vision_backends.run(page(args.out, vision_backends.DOC), args.seed, command, log)
        record["vision"] = asdict(vision)
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1, default=str))
    return 0


def run_engine_parts(plan: Plan, args: argparse.Namespace, machine: Machine, command: str) -> tuple[Run, LlavaOnevisionAdapter]:
    """Parts 1-3, in the order that keeps the RSS figures of part 3 free of the real-size model."""
    parts = Parts()
    cases, adapter = parts.run("tiny model", run_tiny, plan, args.seed)
    bounds = parts.run("memory bound", run_bound, adapter, plan, args.seed)
    real = parts.run("real-size model", real_size.run, plan.real_frames, plan.real_repeats, args.seed, log)
    result = Run(
        command=command, quick=args.quick, seed=args.seed, machine=machine, load_end=os.getloadavg(),
        part_s=parts.wall_s, part_cpu_s=parts.cpu_s, tiny=cases,
        tiny_geometry_bytes=(adapter.tokens_per_frame, adapter.geometry.bytes_per_token),
        real=real, bound=bounds,
    )
    return result, adapter


def page(out: str | None, default: str) -> Path | None:
    """Where a part writes: None (print) for ``--out -``, else ``--out`` or the part's own page, under the repo."""
    return None if out == "-" else REPO / (out or default)


def emit(out: Path | None, section: str, update) -> None:
    """Print ``section`` (``out`` None) or write it into its span of ``out`` with ``update``."""
    if out is None:
        print(section)
    else:
        update(out, section)
        log(f"results written to {out}")


if __name__ == "__main__":
    sys.exit(main())
