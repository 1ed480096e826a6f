"""The engine's ingest and TTFT at LLaVA-OneVision-0.5B and -7B geometry on a GPU (bfloat16, random weights).

``python -m bench.gpu_geometry --device cuda --out gpu-checks/geometry.md`` (run by
``scripts/gpu_checks.sh`` where a GPU is lent; docs/TESTING.md#on-a-gpu-where-one-is-lent).

Why random weights: a dense product costs the same whatever the values, and nothing may be
downloaded; the shapes are the checkpoints' (``bench/real_size.py`` for 0.5B; Qwen2-7B's
decoder for 7B: 28 layers, hidden 3584, 28 query / 4 KV heads of 128, MLP 18944), with the
same SigLIP-so400m tower at 384 px, so 196 tokens a frame, the KV bytes and the FLOPs are the
real models'. The byte-level tokenizer of ``real_size`` stands in for Qwen2's (its vocabulary
of 261 leaves out the 151,936-row embedding and LM head: one product per generated token).

What one row measures, on one device, one geometry at a time (one process, one CUDA context):
the model built directly on the device in ``--dtype`` (parameters drawn there: no host copy),
a warm-up on a throwaway engine, then ``--frames`` synthetic frames ingested one at a time as the node does, under ``rekv`` with
an 8-frame window, 12 frames resident and the rest in the host arena (``real_size``'s memory,
so the rows compare with its CPU row); per frame the vision encoder and the whole ingest
(p50/p95 from frame 10 on, a full window); TTFT of a multiple-choice and an open question asked
after a quarter of the stream and again at its end (a question attends the same number of
frames either way, so the two should agree: the flat-TTFT check at real size); the resident and
offloaded KV and the device's peak memory.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from transformers import LlavaOnevisionForConditionalGeneration
from transformers.initialization import no_init_weights

from videokv_node.memory import GenerationConfig, VideoMemoryEngine
from videokv_node.models.llava_onevision import LlavaOnevisionAdapter, onevision_config
from videokv_node.models.tiny_tokenizer import build_tiny_tokenizer

from bench import real_size
from bench.timing import Summary
from bench.workload import ingest_stream, mc_question, open_question, stream, time_question

VISION = real_size.SIGLIP_SO400M
TEXT = {
    "0.5b": real_size.QWEN2_0_5B,
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4),
    # Small enough to run the whole path on a CPU (the test of this module); not a checkpoint's shape.
    "test": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2),
}
TEST_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=56, patch_size=14)
STEADY_FROM = 10  # 1-based first frame of the percentiles: the window (8) is full
OFFLOAD_BYTES = 4 << 30  # 7B's 11 MiB a frame: room for ~370 frames in the host arena


@dataclass(frozen=True, slots=True)
class GeometryRow:
    geometry: str
    device: str
    device_name: str
    dtype: str
    n_params: int
    build_s: float
    frames: int
    tokens_per_frame: int
    kv_mib_per_frame: float
    vision_ms: tuple[float, float]  # p50, p95 per frame
    ingest_ms: tuple[float, float]  # per ingest() call: most only queue a frame (memory.prefill_batch), read the mean
    ingest_mean_ms: float  # steady frames' total ingest time / their count: the cost of a frame
    ttft_mc_ms: dict[int, tuple[float, float]]  # frames streamed when asked -> p50, p95
    ttft_open_ms: dict[int, tuple[float, float]]
    context_tokens: int
    resident_mib: float
    offloaded_mib: float
    peak_device_mib: float


@contextmanager
def default_dtype(dtype: torch.dtype):
    """Parameters are created in ``dtype``; transformers computes RoPE's inverse frequencies in float32 explicitly."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@torch.no_grad()
def build(geometry: str, device: torch.device, dtype: torch.dtype, seed: int) -> LlavaOnevisionAdapter:
    tokenizer = build_tiny_tokenizer()
    text = dict(TEXT[geometry], **real_size.QWEN2_POSITIONS)
    config = onevision_config(tokenizer, text, TEST_VISION if geometry == "test" else VISION)
    with device, default_dtype(dtype), no_init_weights():
        model = LlavaOnevisionForConditionalGeneration(config)
    real_size.fill_random_weights(model, seed)
    return LlavaOnevisionAdapter(model.eval(), tokenizer, name=f"llava-onevision-{geometry} geometry, random weights")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    geometry: str, device: torch.device, dtype: torch.dtype, frames: int, repeats: int, seed: int, log, profile: str | None = None
) -> GeometryRow:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    adapter = build(geometry, device, dtype, seed)
    sync(device)
    build_s = time.perf_counter() - t0
    log(f"  {geometry}: built in {build_s:.1f} s on {device}")
    config = replace(real_size.memory_config(adapter), offload_bytes=OFFLOAD_BYTES)
    # Warm-up on a throwaway engine: CUDA picks kernels for each new shape on first use (the first
    # run's vision p95 was 0.8 s at 0.5B and 20 ms at 7B, whose shapes the 0.5B run had warmed).
    warm = VideoMemoryEngine(adapter, config, GenerationConfig())
    ingest_stream(warm, stream(STEADY_FROM + 4, seed + 1))
    time_question(warm, mc_question(), 0, 1)
    time_question(warm, open_question(), 0, 1)
    warm.close()
    engine = VideoMemoryEngine(adapter, config, GenerationConfig())
    asked_at = sorted({max(STEADY_FROM + 1, frames // 4), frames})
    frame_iter = stream(frames, seed)
    vision, total, mc, open_ = [], [], {}, {}
    done = 0
    for stop in asked_at:
        part = ingest_stream(engine, (next(frame_iter) for _ in range(stop - done)))
        vision += part.vision_s
        total += part.total_s
        done = stop
        mc[stop] = time_question(engine, mc_question(), 1, repeats)
        open_[stop] = time_question(engine, open_question(), 1, repeats)
        log(f"  {geometry}: {stop} frames, ttft mc p50 {mc[stop].ttft.p50_ms:.1f} ms")
    if profile is not None:  # where a question's time goes, once the numbers above are taken
        profiler = cProfile.Profile()
        profiler.runcall(time_question, engine, mc_question(), 0, 3)
        with open(profile, "a") as out:
            out.write(f"## {geometry} on {device}: three multiple-choice questions after {frames} frames\n")
            pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(40)
    stats = engine.stats()
    engine.close()
    steady = slice(STEADY_FROM - 1, None)
    ms = lambda s: (round(s.p50_ms, 2), round(s.p95_ms, 2))  # noqa: E731
    row = GeometryRow(
        geometry=geometry,
        device=str(device),
        device_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        dtype=str(dtype).removeprefix("torch."),
        n_params=sum(p.numel() for p in adapter.model.parameters()),
        build_s=round(build_s, 2),
        frames=frames,
        tokens_per_frame=adapter.tokens_per_frame,
        kv_mib_per_frame=round(adapter.tokens_per_frame * adapter.geometry.bytes_per_token / 2**20, 3),
        vision_ms=ms(Summary.of(vision[steady])),
        ingest_ms=ms(Summary.of(total[steady])),
        ingest_mean_ms=round(1e3 * sum(total[steady]) / len(total[steady]), 2),
        ttft_mc_ms={k: ms(v.ttft) for k, v in mc.items()},
        ttft_open_ms={k: ms(v.ttft) for k, v in open_.items()},
        context_tokens=mc[frames].context_tokens,
        resident_mib=round(stats.bytes_resident / 2**20, 1),
        offloaded_mib=round(stats.bytes_offloaded / 2**20, 1),
        peak_device_mib=round(torch.cuda.max_memory_allocated(device) / 2**20, 1) if device.type == "cuda" else 0.0,
    )
    del engine, adapter
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def table(rows: list[GeometryRow]) -> str:
    lines = [
        "| geometry | device | dtype | params | frames | KV a frame | vision p50/p95 | ingest a frame (mean) | TTFT mc p50 (at frames) | TTFT open p50 (at frames) | context tokens | resident / offloaded | device peak |",
        "| --- | --- | --- | ---: | ---: | ---: | --- | --- | --- | --- | ---: | --- | ---: |",
    ]
    for r in rows:
        at = lambda d: ", ".join(f"{v[0]:.1f} ms ({k})" for k, v in d.items())  # noqa: E731
        lines.append(
            f"| {r.geometry} | {r.device_name} | {r.dtype} | {r.n_params / 1e9:.2f} B | {r.frames} | {r.kv_mib_per_frame:.2f} MiB "
            f"| {r.vision_ms[0]:.1f} / {r.vision_ms[1]:.1f} ms | {r.ingest_mean_ms:.1f} ms "
            f"| {at(r.ttft_mc_ms)} | {at(r.ttft_open_ms)} | {r.context_tokens} "
            f"| {r.resident_mib:.0f} / {r.offloaded_mib:.0f} MiB | {r.peak_device_mib / 1024:.1f} GiB |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--geometries", default="0.5b,7b", help="comma-separated: 0.5b, 7b, test")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--frames", type=int, default=240)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", default=None, help="append a cProfile of three questions per geometry to this file")
    parser.add_argument("--out", default="-", help="markdown table path, '-' for stdout; the rows as JSON beside it")
    args = parser.parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device visible to torch", file=sys.stderr)
        return 2
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    rows = []
    for geometry in args.geometries.split(","):
        rows.append(measure(geometry, device, dtype, args.frames, args.repeats, args.seed, log, args.profile))
        if args.out != "-":  # each row as soon as it is measured: a later geometry may not finish
            Path(args.out).with_suffix(".json").write_text(json.dumps([asdict(r) for r in rows], indent=1))
    text = table(rows) + "\n"
    if args.out == "-":
        print(text, end="")
    else:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
