"""Benchmarks of the videokv memory engine on this machine; results go to docs/BENCHMARKS.md.

    python -m bench.run            # full run (about 6-8 minutes on 2 CPU cores)
    python -m bench.run --quick    # short run (about 1-2 minutes), same tables
    make bench                     # the full run, after setting up the environment

Three parts, all seeded and measured with time.perf_counter (warm-up excluded):
1. the tiny model, policies full and rekv: ingest latency, question TTFT and
   memory footprint at several memory sizes;
2. the LLaVA-OneVision-0.5B geometry with random weights (nothing downloaded):
   vision and decoder cost per frame, KV bytes per frame, question TTFT;
3. the memory bound over a long tiny stream: peaks against the caps (fails the
   run if a cap is ever exceeded).

Only the span between the result markers of --out is rewritten.
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

from bench import bound, real_size, tiny
from bench.machine import describe
from bench.report import Run, render, update_document

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


FULL = Plan(memory_sizes=(50, 200, 1000), measured_frames=200, tiny_repeats=10,
            real_frames=24, real_repeats=3, bound_frames=5000)
QUICK = Plan(memory_sizes=(50, 200), measured_frames=50, tiny_repeats=5,
             real_frames=3, real_repeats=1, bound_frames=1000)
POLICIES = ("full", "rekv")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer frames and repeats (about 1-2 minutes)")
    parser.add_argument(
        "--out", default="docs/BENCHMARKS.md",
        help="markdown file whose results section is rewritten (relative to the repo root); '-' prints it",
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
    parts = Parts()
    cases, adapter = parts.run("tiny model", run_tiny, plan, args.seed)
    # Before the real-size part, so the RSS figures are the tiny model's process alone.
    bounds = parts.run("memory bound", run_bound, adapter, plan, args.seed)
    real = parts.run("real-size model", real_size.run, plan.real_frames, plan.real_repeats, args.seed, log)
    command = "python -m bench.run" + "".join(f" {shlex.quote(a)}" for a in (sys.argv[1:] if argv is None else argv))
    result = Run(
        command=command, quick=args.quick, seed=args.seed, machine=machine, load_end=os.getloadavg(),
        part_s=parts.wall_s, part_cpu_s=parts.cpu_s, tiny=cases,
        tiny_geometry_bytes=(adapter.tokens_per_frame, adapter.geometry.bytes_per_token),
        real=real, bound=bounds,
    )
    section = render(result)
    if args.out == "-":
        print(section)
    else:
        out = REPO / args.out
        update_document(out, section)
        log(f"results written to {out}")
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(result), indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
