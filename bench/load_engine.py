"""The engine alone (no ROS) doing the load bench's work: RSS against the memory's own KV bytes.

Each round ingests one frame of each of four cameras (three 640x480, one 1280x720), asks
a multiple-choice and a short open question, and every other round locates, as
``bench/load.py``'s planner does against the node; it prints the process's RSS and the
memory's KV bytes (resident + host arena) every 10 rounds, the growth of both over the second
half, and the p50 times. Used to find where the node's RSS growth comes from and to compare
remedies: ``--prefill-batch 1 --heap-trim-mib 0`` is the engine before batched prefill and heap
trimming (the node's worker trims as ``--heap-trim-mib`` does, ``runtime/heap_trim.py``); glibc
settings by environment, e.g. ``MALLOC_MMAP_THRESHOLD_=131072 python -m bench.load_engine``.
Compare runs one after another on the same machine, with its load average (``uptime``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import yaml

from videokv_node.memory.engine import VideoMemoryEngine
from videokv_node.memory.questions.locate import LocateQuery
from videokv_node.memory.question import Frame, Question
from videokv_node.models.factory import load_adapter
from videokv_node.runtime.heap_trim import HeapTrim
from videokv_node.settings import build_settings
from videokv_node.synthetic import SyntheticScene
from videokv_node.vision.selection import attach_vision_backend


def rss_mib() -> float:
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--torch-threads", type=int, default=1)
    p.add_argument("--model", default="videokv-tiny")
    p.add_argument("--prefill-batch", type=int, default=None, help="memory.prefill_batch (default: the node's)")
    p.add_argument("--heap-trim-mib", type=int, default=16, help="trim the C heap when RSS grew this much (0: never), as the worker")
    p.add_argument("--set", action="append", default=[], metavar="PARAM=VALUE",
                   help="a node parameter (YAML value), e.g. memory.budget_tokens=600 memory.offload_bytes=4194304: "
                        "small caps, so the memory is full for the run's second half")
    args = p.parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    overrides = {} if args.prefill_batch is None else {"memory.prefill_batch": args.prefill_batch}
    for item in args.set:
        name, _, value = item.partition("=")
        overrides[name] = yaml.safe_load(value)
    s = build_settings(overrides)
    adapter = load_adapter(args.model, device="cpu", dtype="auto", seed=0)
    attach_vision_backend(adapter, s.vision)
    engine = VideoMemoryEngine(adapter, s.memory, s.generation)
    scenes = [SyntheticScene(640, 480, seed=c) for c in range(3)] + [SyntheticScene(1280, 720, seed=3)]
    times: dict[str, list[float]] = {"ingest per frame": [], "ask": [], "locate": []}
    heap = HeapTrim(args.heap_trim_mib << 20)
    start_rss = rss_mib()
    half: tuple[float, float] = (start_rss, 0.0)  # RSS and KV MiB at half time

    def timed(key: str, run, n: int = 1) -> None:
        t = time.perf_counter()
        run()
        times[key].append((time.perf_counter() - t) / n)
        heap.maybe_trim()  # after the work, as the worker does

    for r in range(args.rounds):
        frames = [Frame(f"/cam{c}", (2 * r * 4 + c) * 10**9 // 4, scene.frame(r % len(scene))) for c, scene in enumerate(scenes)]
        timed("ingest per frame", lambda: engine.ingest(frames), len(frames))
        timed("ask", lambda: engine.ask(Question("What colour is the ball?", options=["red", "green", "blue"])))
        timed("ask", lambda: engine.ask(Question("What do you see?", max_new_tokens=8)))
        if r % 2 == 0:
            timed("locate", lambda: engine.locate(LocateQuery("the red ball", 3)))
        st = engine.stats()
        kv = (st.bytes_resident + st.bytes_offloaded) / 2**20
        if r + 1 == args.rounds // 2:
            half = (rss_mib(), kv)
        if r % 10 == 9 or r == args.rounds - 1:
            print(f"round {r + 1}: RSS {rss_mib():.0f} MiB (+{rss_mib() - start_rss:.0f}), KV {kv:.1f} MiB, "
                  f"{st.frames_in_memory} frames held, {st.frames_evicted} evicted", flush=True)
    grew = rss_mib() - half[0]
    print(f"second half: RSS +{grew:.0f} MiB (+{100 * grew / half[0]:.1f}%), KV +{kv - half[1]:.1f} MiB; "
          f"heap trims {heap.trims} taking {heap.trim_s * 1e3:.0f} ms in all")
    print(f"MALLOC_MMAP_THRESHOLD_={os.environ.get('MALLOC_MMAP_THRESHOLD_', 'unset')}, torch threads {args.torch_threads}, "
          f"prefill_batch {s.memory.prefill_batch}, heap trim {args.heap_trim_mib} MiB: "
          + ", ".join(f"{k} p50 {statistics.median(v) * 1e3:.0f} ms" for k, v in times.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
