"""ReKV's two selections side by side: TTFT at 100 and at N frames (tiny LLaVA-OneVision).

    python -m bench.selection_ttft --frames 10000

The settings of ``make bench-scaling`` (``bench/scaling.py``: resident budget, window, pages,
the multiple-choice question answered by the option letters' logits), one engine per
``memory.rekv.selection`` and stream length, filled untimed with the first frames of one
stream, then answered in alternation (one warm-up, ``--repeats`` timed) so that the machine's
drift falls on all four alike. Prints the p50 TTFT of each and the ratio N / 100 per selection:
what ``shared`` (one probe prefill and a sort of the candidates per layer) adds to ReKV's
per-layer retrieval, and whether it stays flat in what memory holds (issue 16).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from itertools import islice

import torch

from bench.scaling import EARLY, tiny_config
from bench.workload import mc_question, stream
from videokv_node.memory import GenerationConfig, VideoMemoryEngine
from videokv_node.memory.config import REKV_SELECTIONS, ReKVConfig
from videokv_node.models.llava_onevision import LlavaOnevisionAdapter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.selection_ttft", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    if args.frames <= EARLY:
        parser.error(f"--frames must be above {EARLY}")
    torch.set_num_threads(1)  # as make bench-scaling (OMP_NUM_THREADS=1)
    adapter = LlavaOnevisionAdapter.tiny()
    engines = {}
    for selection in REKV_SELECTIONS:
        for n in (EARLY, args.frames):
            engine = VideoMemoryEngine(adapter, tiny_config(adapter, "rekv", rekv=ReKVConfig(selection=selection)), GenerationConfig())
            for frame in islice(stream(args.frames, seed=0), n):
                engine.ingest([frame])
            engines[selection, n] = engine
    question = mc_question()
    times = {key: [] for key in engines}
    for engine in engines.values():
        engine.ask(question, option_scoring="letter")  # warm-up
    for _ in range(args.repeats):
        for key, engine in engines.items():
            times[key].append(engine.ask(question, option_scoring="letter").ttft_s)
    p50 = {key: statistics.median(t) for key, t in times.items()}
    for selection in REKV_SELECTIONS:
        early, late = p50[selection, EARLY], p50[selection, args.frames]
        print(f"{selection}: TTFT p50 {1e3 * early:.1f} ms at {EARLY} frames, {1e3 * late:.1f} ms at {args.frames}: "
              f"{late / early:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
