"""``make bench-load-view``: what the memory's drawing (issue 46: ``~/memory_markers``, ``~/memory_sheet``) costs the node.

Runs of ``bench/load.py``'s load, one after another, with the same cameras and planner: the node's defaults
(markers and sheet on), then ``markers.enabled: false`` and ``sheet.enabled: false`` (``--repeats``: again, in ABBA
order, so that the shared machine's drift weighs on both); one row a run with frames
ingested, the ingest time per frame (``~/memory_stats``, p50 / p95), the node's CPU, ``~/ask``'s latency and RSS.
Then the sheet's thumbnail store (``view/contact_sheet.py``'s ``Thumbnails``, the node's default ``sheet.*``) filled
with an hour of one camera's sampled frames (1,800 at ``sample_fps`` 0.5, 3,600 at 1) of the load's frame sizes, all
of them in memory: the bytes it holds against its cap, what they would be uncapped, the cost of keeping a thumbnail,
and of drawing the sheet from that memory.

    python -m bench.load_view [--seconds 180] [--repeats 1] [--frames 1800,3600] [bench.load's options] [--out docs/bench/load.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from bench import load
from bench.machine import describe
from bench.report import log, run_table, table, update_document
from videokv_node.node_settings import SheetSettings
from videokv_node.view.contact_sheet import Thumbnails, render_sheet
from videokv_node.view.memory_view import RESIDENT, FrameView, MemoryView

NS = 1_000_000_000
VARIANTS = (("markers and sheet on (defaults)", []),
            ("markers and sheet off", [("markers.enabled", False), ("sheet.enabled", False)]))
LABEL = "view costs: markers and sheet on vs off"


def thumbnail_costs(frames: int, width: int, height: int, sheet: SheetSettings = SheetSettings(),
                    period_s: float = 2.0) -> dict:
    """The thumbnail store after ``frames`` sampled frames of one camera, ``period_s`` apart, all still in memory."""
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    thumbs = Thumbnails(sheet.thumbnail_bytes, sheet.thumbnail_width)
    views = [FrameView(i, "/cam0", (round(i * period_s * NS),), (None,), RESIDENT) for i in range(frames)]
    t0 = time.perf_counter()
    for f in views:
        thumbs.add(f.camera, f.stamp_ns, rgb)
    add_us = (time.perf_counter() - t0) / frames * 1e6
    view = MemoryView(tuple(views))
    t0 = time.perf_counter()
    thumbs.prune(view)
    drawn = render_sheet(view, thumbs, sheet)
    sheet_ms = (time.perf_counter() - t0) * 1e3
    one = thumbs.get("/cam0", views[-1].stamp_ns).nbytes
    return dict(frames=frames, size=f"{width}x{height}", thumbnail=one, uncapped=frames * one, held=thumbs.bytes,
                kept=len(thumbs), cap=sheet.thumbnail_bytes, add_us=add_us, sheet_ms=sheet_ms,
                sheet_bytes=len(drawn.jpeg) if drawn else 0)


def _row(name: str, res: dict) -> list[str]:
    f = res["final"]
    start, end = res["load"]
    s = [x for x in res["samples"] if start <= x[0] <= end] or res["samples"]
    cpu = (s[-1][1] - s[0][1]) / max(1e-9, s[-1][0] - s[0][0])
    asks = [x for r in res["requests"] if r.kind == "ask" for x in r.records]
    ok = sorted(lat for lat, success, _, _ in asks if success)
    return [name, f"{f.frames_received}", f"{f.frames_sampled}", f"{f.frames_ingested}",
            f"{f.ingest_ms_p50:.0f} / {f.ingest_ms_p95:.0f}", f"{100 * cpu:.0f}%",
            f"{len(ok)} of {len(asks)}, p50 {statistics.median(ok):.2f} s" if ok else f"0 of {len(asks)}",
            f"{s[-1][2] / 2**20:.0f} MiB", "yes" if res["alive"] else "NO"]


def render(rows: list[list[str]], costs: list[dict], machine, command: str, wall_s: float, params: dict) -> str:
    kib = lambda b: f"{b / 1024:,.0f} KiB"  # noqa: E731
    out = [f"### {LABEL}", "", run_table(machine, machine.torch_threads, f"`{command}`", wall_s, os.getloadavg()), "",
           f"The same load with each variant, one run after another (node parameters besides the variant's: `{params}`); "
           "ingest per frame from `~/memory_stats` (its last 100 frames), CPU of the node process over the load.", "",
           table(["variant", "received", "sampled", "ingested", "ingest p50 / p95 (ms)", "node CPU", "~/ask answered",
                  "RSS at the end", "node up"], rows), "",
           "The sheet's thumbnail store (default `sheet.thumbnail_width` 96, `sheet.thumbnail_bytes` "
           f"{kib(SheetSettings().thumbnail_bytes)}) after an hour of one camera's sampled frames, all in memory:", "",
           table(["frames", "frame", "a thumbnail", "uncapped", "held (cap)", "thumbnails kept", "keeping one",
                  "sheet drawn from that memory"],
                 [[f"{c['frames']:,}", c["size"], f"{c['thumbnail']:,} B", kib(c["uncapped"]),
                   f"{kib(c['held'])} ({kib(c['cap'])})", f"{c['kept']:,}", f"{c['add_us']:.0f} us",
                   f"{c['sheet_ms']:.0f} ms, {kib(c['sheet_bytes'])} JPEG"] for c in costs])]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--frames", default="1800,3600", help="sampled frames in the thumbnail store: an hour at 0.5 and 1 fps")
    own.add_argument("--repeats", type=int, default=1, help="runs of each variant, in ABBA order (on, off, off, on, ...)")
    mine, rest = own.parse_known_args(argv)
    args = load.parser().parse_args(rest)
    command = "python -m bench.load_view " + " ".join(argv)
    machine, t0 = describe(load.REPO), time.monotonic()
    rows = []
    for k in range(mine.repeats):  # ABBA: a drift of the shared machine over the runs weighs on both variants alike
        for name, params in VARIANTS[::-1] if k % 2 else VARIANTS:
            log(f"variant: {name} (run {k + 1})")
            res = load.run(argparse.Namespace(**{**vars(args), "param": list(args.param) + params}))
            rows.append(_row(f"{name}, run {k + 1}" if mine.repeats > 1 else name, res))
    costs = [thumbnail_costs(int(n), w, h) for n in mine.frames.split(",")
             for w, h in ((args.raw_width, args.raw_height), (args.jpeg_width, args.jpeg_height))]
    section = render(rows, costs, machine, command, time.monotonic() - t0, dict(args.param))
    if args.out == "-":
        print(section)
    else:
        path = load.REPO / args.out
        update_document(path, section, f"<!-- bench-load:{LABEL}:begin (generated by bench/load_view.py) -->",
                        f"<!-- bench-load:{LABEL}:end -->")
        log(f"written to {args.out}")
    return 0 if all(r[-1] == "yes" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
