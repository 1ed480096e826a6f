"""``make bench-load``: the node under a robot's camera load, with a planner asking and locating.

The node runs as its own process (``NodeProcess``, its own DDS domain); each camera is a
driver in its own process (``bench/load_camera.py``: SensorData QoS, stamped when taken);
this process asks ``~/ask`` every ``--ask-period`` s and ``~/locate`` every
``--locate-period`` s without waiting for the previous answer (a planner does not), and
reads the node's ``/proc/PID/stat`` (CPU) and ``/proc/PID/status`` (RSS) every second.

Reported: per camera, frames published (by the drivers), received, sampled, ingested,
and dropped by reason (the node's ``/diagnostics`` camera statuses; totals from
``~/memory_stats`` for a node without them), ingest against what ``sample_fps`` asks for;
answer and locate latency p50/p95/max with every refusal's reason; the node's CPU; and
its RSS at the load's start, middle and end, next to the memory's own KV bytes (the host
arena is pageable: it is committed as it fills, bounded by ``memory.offload_bytes``).

    python -m bench.load [--seconds 180] [--raw 3] [--jpeg 1] [--hz 15] [--label after] [--out docs/bench/load.md]

The page keeps the latest run (``publish_latest``: each run replaces it); compare runs with ``--out -`` or
``--out FILE`` and read them in a dated note.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import rclpy
import yaml
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.context import Context

from bench.machine import describe
from bench.report import log, run_table, table, update_document
from videokv_node.programs.client import MemoryClient
from videokv_node.programs.launcher import NodeProcess, isolated_ros_env

REPO = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")
QUESTIONS = [("What colour is the ball?", ["red", "green", "blue"], 0), ("What do you see?", [], 8)]
LOCATE_QUERY = "the red ball"


class ProcWatch(threading.Thread):
    """Samples a process's CPU seconds (utime + stime) and RSS bytes every second: (monotonic s, cpu s, rss)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.samples, self._stop = pid, [], threading.Event()

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
                rss = next(int(line.split()[1]) * 1024 for line in Path(f"/proc/{self.pid}/status").read_text().splitlines()
                           if line.startswith("VmRSS:"))
            except (OSError, StopIteration):
                return
            self.samples.append((time.monotonic(), (int(fields[11]) + int(fields[12])) / CLK_TCK, rss))
            self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()


class Requester:
    """Sends one request every ``period`` s on its own thread (open loop) until ``stop``; records each outcome."""

    def __init__(self, kind: str, period: float, send) -> None:
        self.kind, self.period, self.send = kind, period, send
        self.records: list[tuple[float, bool, str, float]] = []  # (latency s, success, message, node's own time s)
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._loop = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._loop.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.wait(0 if i == 0 else self.period):
            t = threading.Thread(target=self._one, args=(i,), daemon=True)
            t.start()
            self._threads.append(t)
            i += 1

    def _one(self, i: int) -> None:
        t0 = time.monotonic()
        try:
            resp = self.send(i)
            model_s = resp.total_s if hasattr(resp, "total_s") else resp.latency_s  # ask / locate
            record = (time.monotonic() - t0, bool(resp.success), resp.message, float(model_s))
        except TimeoutError as exc:
            record = (time.monotonic() - t0, False, f"client timeout: {exc}", 0.0)
        with self._lock:
            self.records.append(record)

    def stop(self, wait_s: float) -> None:
        self._stop.set()
        self._loop.join()
        deadline = time.monotonic() + wait_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))


def cameras(args) -> list[dict]:
    """The cameras' specs: ``--raw`` raw rgb8 ones then ``--jpeg`` compressed ones, all at ``--hz``."""
    raw = [dict(topic=f"/cam{i}/image_raw", kind="raw", width=args.raw_width, height=args.raw_height) for i in range(args.raw)]
    jpeg = [dict(topic=f"/cam{args.raw + i}/image_raw/compressed", kind="jpeg", width=args.jpeg_width,
                 height=args.jpeg_height) for i in range(args.jpeg)]
    return [dict(c, hz=args.hz) for c in raw + jpeg]


def run(args) -> dict:
    """Run the load once; returns everything ``render`` reports."""
    cams = cameras(args)
    env = isolated_ros_env()
    if args.fastdds_profile:  # the node, the drivers and this client: the writer's segment must hold the frame
        env["FASTRTPS_DEFAULT_PROFILES_FILE"] = str(Path(args.fastdds_profile).resolve())
    node_env = dict(env, **dict(kv.split("=", 1) for kv in args.node_env))
    if args.node_pythonpath:  # another checkout's node (a before/after comparison in one session)
        node_env["PYTHONPATH"] = f"{Path(args.node_pythonpath).resolve()}:{env.get('PYTHONPATH', '')}"
    params = {"image_topics": [c["topic"] for c in cams if c["kind"] == "raw"] or [""],
              "compressed_topics": [c["topic"] for c in cams if c["kind"] == "jpeg"] or [""],
              "stats_period_s": 1.0, **dict(args.param)}
    tmp = Path(tempfile.mkdtemp(prefix="videokv-load-"))
    node = NodeProcess(params, node_env, log_path=tmp / "node.log")
    saved = dict(os.environ)
    os.environ.update({k: env[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE", "RMW_IMPLEMENTATION",
                                           "FASTRTPS_DEFAULT_PROFILES_FILE") if k in env})
    ctx = Context()
    rclpy.init(context=ctx)
    client = MemoryClient(context=ctx, client_name="load_planner")
    diagnostics: dict[str, dict[str, str]] = {}
    client.node.create_subscription(DiagnosticArray, "/diagnostics", lambda m: diagnostics.update(
        {v["topic"]: v for v in ({kv.key: kv.value for kv in s.values} for s in m.status
                                 if s.name.startswith("videokv: camera ")) if "topic" in v}), 10)
    drivers = []
    try:
        if not client.wait_ready(timeout=300):
            raise RuntimeError("node did not come up:\n" + node.output()[-3000:])
        watch = ProcWatch(node.proc.pid)
        watch.start()
        for c in cams:
            drivers.append(subprocess.Popen(
                [sys.executable, "-m", "bench.load_camera", "--topic", c["topic"], "--kind", c["kind"], "--width",
                 str(c["width"]), "--height", str(c["height"]), "--hz", str(c["hz"]), "--seconds", str(args.seconds),
                 "--out", str(tmp / f"cam{len(drivers)}.json")], env=env, cwd=REPO))
        client.wait_stats(lambda s: s.frames_received > 0, timeout=60)
        load_start = time.monotonic()
        log(f"load started: {len(cams)} cameras for {args.seconds:.0f} s")
        mc, ask = client.ask, QUESTIONS
        reqs = [Requester("ask", args.ask_period, lambda i: mc(ask[i % 2][0], options=ask[i % 2][1],
                                                              max_new_tokens=ask[i % 2][2], timeout=130))
                for _ in range(args.askers)]
        reqs += [Requester("locate", args.locate_period, lambda i: client.locate(LOCATE_QUERY, top_k=3, timeout=130))
                 for _ in range(args.locators)]
        for r in reqs:
            r.start()
        mid_stats = None
        while any(d.poll() is None for d in drivers):
            time.sleep(0.5)
            if mid_stats is None and time.monotonic() >= load_start + args.seconds / 2:
                mid_stats = client.stats
        load_end = time.monotonic()
        mid_stats = mid_stats or client.stats
        for r in reqs:
            r.stop(wait_s=140)
        client.wait_stats(lambda s: s.queue_depth == 0, timeout=120)
        time.sleep(3.0)  # one more /diagnostics and memory_stats after the queue drained
        watch.stop()
        final = client.stats
        published = [json.loads((tmp / f"cam{i}.json").read_text()) for i in range(len(cams))]
        return dict(cams=cams, published=published, diagnostics=dict(diagnostics), final=final, mid=mid_stats,
                    requests=reqs, samples=watch.samples, load=(load_start, load_end), params=params,
                    alive=node.alive(), node_log=str(node.log_path))
    finally:
        for d in drivers:
            if d.poll() is None:
                d.kill()
        client.close()
        rclpy.try_shutdown(context=ctx)
        node.stop()
        os.environ.clear()
        os.environ.update(saved)


def _trend(points: list[tuple[float, int]]) -> str:
    """The least-squares slope of RSS over time, MiB a minute and as a share of the mean per minute: one sample's
    phase in the heap trims' cycle (``runtime/heap_trim.py``) moves an end-to-middle difference by +-10%."""
    if len(points) < 3:
        return "-"
    t0 = points[0][0]
    xs, ys = [t - t0 for t, _ in points], [r / 2**20 for _, r in points]
    mx, my = statistics.mean(xs), statistics.mean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / max(1e-9, sum((x - mx) ** 2 for x in xs))  # MiB/s
    return f"{60 * slope:+.1f} MiB/min ({100 * 60 * slope / my:+.2f}% of the mean a minute, {len(points)} samples)"


def _lat(values: list[float]) -> str:
    if not values:
        return "-"
    v = sorted(values)
    return f"{statistics.median(v):.2f} / {v[int(0.95 * (len(v) - 1))]:.2f} / {v[-1]:.2f}"


def merged_note(stats) -> str:
    """How many of the ingested frames were still views merged without an encoding (a node before issue 36: none)."""
    merged = getattr(stats, "frames_merged", None)
    return f" ({merged} merged as still)" if merged is not None else ""


def render(res: dict, args, machine, command: str, wall_s: float) -> str:
    """The markdown section of one run."""
    sample_fps = float(res["params"].get("sample_fps", 0.5))
    out = [f"### {args.label}", "", run_table(machine, machine.torch_threads, f"`{command}`", wall_s, os.getloadavg()), "",
           f"Node parameters: `{json.dumps(res['params'])}`; node environment: {' '.join(args.node_env) or 'as is'}; "
           f"Fast DDS profile: {args.fastdds_profile or 'none (defaults)'}.", ""]
    rows = []
    for c, pub in zip(res["cams"], res["published"]):
        d = res["diagnostics"].get(c["topic"], {})
        # Stamps span (published - 1) periods; the sampler keeps the first frame and one per 1/sample_fps after it.
        expected = int(sample_fps * (pub["published"] - 1) / c["hz"]) + 1 if sample_fps > 0 else pub["published"]
        drops = ", ".join(f"{k.removeprefix('frames_dropped_')} {v}" for k, v in sorted(d.items())
                          if k.startswith("frames_dropped_")) or ("0" if d else "-")
        ingested = d.get("frames_ingested", "-")
        share = f" ({100 * int(ingested) / expected:.0f}%)" if ingested != "-" else ""
        rows.append([c["topic"], f"{c['kind']} {pub['size']} @ {c['hz']:g} Hz ({pub['bytes'] / 1024:.0f} KiB)",
                     str(pub["published"]), d.get("frames_received", "-"), d.get("frames_sampled", "-"),
                     f"{ingested}{share} of {expected}", drops])
    f = res["final"]
    rows.append(["all", "", str(sum(p["published"] for p in res["published"])), str(f.frames_received),
                 str(f.frames_sampled), f"{f.frames_ingested}{merged_note(f)}", f"{f.frames_dropped} (memory_stats)"])
    out += [table(["camera", "stream", "published", "received", "sampled", "ingested (of sample_fps)", "dropped by reason"],
                  rows), ""]
    req_rows = []
    for kind in ("ask", "locate"):
        recs = [x for r in res["requests"] if r.kind == kind for x in r.records]
        if not recs:
            continue
        ok = [lat for lat, success, _, _ in recs if success]
        own = [m for _, success, _, m in recs if success]
        reasons: dict[str, int] = {}
        for _, success, msg, _ in recs:
            if not success:
                reasons[msg[:60]] = reasons.get(msg[:60], 0) + 1
        req_rows.append([f"~/{kind}", str(len(recs)), str(len(ok)),
                         "; ".join(f"{n}x {m!r}" for m, n in reasons.items()) or "0", _lat(ok), _lat(own)])
    out += [table(["request", "sent", "answered", "refused (reason)", "latency p50 / p95 / max (s)",
                   "of which on the model p50 / p95 / max (s)"], req_rows), ""]
    start, end = res["load"]
    s = [x for x in res["samples"] if start <= x[0] <= end] or res["samples"]
    mid_t = (start + end) / 2
    first, second = [x[2] for x in s if x[0] < mid_t], [x[2] for x in s if x[0] >= mid_t]
    cpu = (s[-1][1] - s[0][1]) / max(1e-9, s[-1][0] - s[0][0])
    mb = lambda b: f"{b / 2**20:.0f} MiB"  # noqa: E731
    kv = lambda st: st.bytes_resident + st.bytes_offloaded  # noqa: E731
    mid_rss = min(s, key=lambda x: abs(x[0] - mid_t))[2]
    out += [table(["node process", ""], [
        ["CPU", f"{100 * cpu:.0f}% of one core over the load ({s[-1][1] - s[0][1]:.0f} s CPU in {s[-1][0] - s[0][0]:.0f} s)"],
        ["RSS at 0 / 25 / 50 / 75 / 100% of the load", " / ".join(
            mb(min(s, key=lambda x, q=q: abs(x[0] - (start + q * (end - start))))[2]) for q in (0, 0.25, 0.5, 0.75, 1))],
        ["RSS growth over the second half", f"{100 * (s[-1][2] - mid_rss) / mid_rss:+.1f}% "
         f"(mean first half {mb(statistics.mean(first or [0]))}, second half {mb(statistics.mean(second or [0]))})"],
        ["RSS trend over the second half (least squares); the KV's", _trend([(x[0], x[2]) for x in s if x[0] >= mid_t])
         + f"; KV {60 * (kv(f) - kv(res['mid'])) / 2**20 / max(1e-9, end - mid_t):+.1f} MiB/min"],
        ["ingest per frame p50 / p95 (memory_stats, last 100 frames)", f"{f.ingest_ms_p50:.0f} / {f.ingest_ms_p95:.0f} ms"],
        ["memory's KV bytes (resident + host arena) middle / end", f"{mb(kv(res['mid']))} / {mb(kv(f))}"],
        ["node still running at the end", "yes" if res["alive"] else "NO"],
    ])]
    return "\n".join(out) + "\n"


def parser() -> argparse.ArgumentParser:
    """The load's options (``bench/load_view.py`` runs the same load with the view on and off)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=180.0, help="how long the cameras publish")
    p.add_argument("--raw", type=int, default=3, help="raw rgb8 cameras")
    p.add_argument("--jpeg", type=int, default=1, help="JPEG (CompressedImage) cameras")
    p.add_argument("--hz", type=float, default=15.0)
    p.add_argument("--raw-width", type=int, default=640)
    p.add_argument("--raw-height", type=int, default=480)
    p.add_argument("--jpeg-width", type=int, default=1280)
    p.add_argument("--jpeg-height", type=int, default=720)
    p.add_argument("--askers", type=int, default=1, help="planners each calling ~/ask every --ask-period s")
    p.add_argument("--ask-period", type=float, default=2.0)
    p.add_argument("--locators", type=int, default=1, help="clients each calling ~/locate every --locate-period s")
    p.add_argument("--locate-period", type=float, default=5.0)
    p.add_argument("--param", action="append", default=[], type=lambda kv: (kv.split("=", 1)[0], yaml.safe_load(kv.split("=", 1)[1])),
                   help="a node parameter, name=value (YAML), repeatable")
    p.add_argument("--fastdds-profile", default="", help="Fast DDS XML profile for every process (e.g. "
                   "config/fastdds_large_images.xml: raw 640x480 frames published best effort are mostly lost without it)")
    p.add_argument("--node-env", action="append", default=[], help="NAME=VALUE in the node's environment only, "
                   "repeatable (e.g. MALLOC_MMAP_THRESHOLD_=131072)")
    p.add_argument("--node-pythonpath", default="", help="run the node from this source tree (e.g. a base checkout's videokv_node/)")
    p.add_argument("--label", default="run", help="the section's title (the page keeps one run: this one replaces the last)")
    p.add_argument("--out", default="docs/bench/load.md", help="markdown file under the repo, or - to print")
    return p


LATEST = ("<!-- bench-load:latest:begin (generated by bench/load.py; each run replaces it) -->",
          "<!-- bench-load:latest:end -->")


def publish_latest(path: Path, section: str) -> None:
    """Write ``section`` as the page's one latest run, replacing the one before (the page keeps its latest run;
    older ones are in docs/notes/2026-11-28-load-history.md, comparisons in dated notes); the rest of the page,
    ``bench.load_view``'s section included, is left as it is."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("# A robot's camera load (`make bench-load`)\n")
    update_document(path, section, *LATEST)


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    command = "python -m bench.load " + " ".join(argv if argv is not None else sys.argv[1:])
    machine, t0 = describe(REPO), time.monotonic()
    res = run(args)
    section = render(res, args, machine, command, time.monotonic() - t0)
    if args.out == "-":
        print(section)
    else:
        publish_latest(REPO / args.out, section)
        log(f"written to {args.out}")
    log(f"node log: {res['node_log']}")
    return 0 if res["alive"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
