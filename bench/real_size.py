"""LLaVA-OneVision-0.5B geometry with random weights: real per-frame costs, no download.

The decoder (Qwen2-0.5B: 24 layers, hidden 896, 14 query / 2 KV heads) and the
vision tower (SigLIP-so400m: 27 layers, hidden 1152, 384 px, patch 14) have the
checkpoint's shapes, so FLOPs, KV bytes and 196 tokens per frame are those of
``llava-onevision-qwen2-0.5b-ov``; only the values of the weights differ, and a
dense float32 matmul costs the same whatever the values.

Departures from the checkpoint, both shrinking work that is not the memory's:
- the tokenizer is the byte-level one of the tiny model, so the text vocabulary
  is 261 instead of 151936 (a 136M-parameter embedding and LM head left out:
  they cost one (896 x vocab) product per generated token), and prompts are
  one token per byte, about 4x longer than with Qwen2's BPE;
- weights are drawn uniform with the std of the usual N(0, 0.02) init, norms
  set to 1 and biases to 0, instead of transformers' per-module init (which
  takes ~30 s on 2 cores for nothing a timing can see).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import torch
from transformers import LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration
from transformers.initialization import no_init_weights

from videokv_node.memory import EngineStats, GenerationConfig, MemoryConfig, VideoMemoryEngine
from videokv_node.models.adapter import KVGeometry
from videokv_node.models.llava_onevision import LlavaOnevisionAdapter, onevision_config
from videokv_node.models.tiny_tokenizer import build_tiny_tokenizer

from bench.timing import Summary
from bench.workload import QuestionTiming, ingest_stream, mc_question, open_question, stream, time_question

NAME = "llava-onevision-qwen2-0.5b geometry, random weights"
WINDOW_FRAMES = 8
RETRIEVE_FRAMES = 8
RESIDENT_FRAMES = 12  # the window and 4 more on the device; older frames go to the host arena
OFFLOAD_BYTES = 1 << 30
INIT_STD = 0.02


# The checkpoint's shapes (config.json of llava-onevision-qwen2-0.5b-ov); bench/gpu_geometry.py uses them too.
QWEN2_0_5B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2)
SIGLIP_SO400M = dict(hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16, image_size=384, patch_size=14)
QWEN2_POSITIONS = dict(max_position_embeddings=32768, rope_theta=1_000_000.0)


def real_size_config(tokenizer) -> LlavaOnevisionConfig:
    """llava-onevision-qwen2-0.5b's shapes: Qwen2-0.5B decoder, SigLIP-so400m tower at 384 px."""
    return onevision_config(tokenizer, dict(QWEN2_0_5B, **QWEN2_POSITIONS), SIGLIP_SO400M)


@torch.no_grad()
def fill_random_weights(model: torch.nn.Module, seed: int) -> None:
    """Seeded weights of the checkpoint's scale (std INIT_STD, uniform: cheap to draw), zero biases, unit norms."""
    device = next(model.parameters()).device  # drawn where the weights live (a GPU build never copies from the host)
    generator = torch.Generator(device=device).manual_seed(seed)
    bound = INIT_STD * math.sqrt(3.0)  # uniform(-b, b) has std b / sqrt(3)
    for name, param in model.named_parameters():
        if name.endswith("bias"):
            param.zero_()
        elif "norm" in name:
            param.fill_(1.0)
        else:
            param.uniform_(-bound, bound, generator=generator)


@torch.no_grad()
def build_adapter(seed: int) -> LlavaOnevisionAdapter:
    """The real-size model in float32 on the CPU, weights drawn from ``seed``."""
    tokenizer = build_tiny_tokenizer()
    config = real_size_config(tokenizer)
    with no_init_weights():  # buffers (rotary inv_freq, position ids) are still computed
        model = LlavaOnevisionForConditionalGeneration(config)
    fill_random_weights(model, seed)
    adapter = LlavaOnevisionAdapter(model, tokenizer, name=NAME)
    if adapter.tokens_per_frame != 196:
        raise RuntimeError(f"expected 196 tokens per frame as the checkpoint, got {adapter.tokens_per_frame}")
    return adapter


@dataclass(frozen=True, slots=True)
class RealSizeResult:
    build_s: float  # model construction and weight init (not a load time: nothing is read from disk)
    n_params: int
    geometry: KVGeometry
    tokens_per_frame: int
    sink_tokens: int  # prompt tokens before the first frame (byte-level: ~4x a BPE tokenizer's count)
    config: MemoryConfig
    n_frames: int  # frames streamed
    vision: Summary  # per frame, frames 2..n (the first is warm-up)
    decoder: Summary  # per frame: decoder pass over sink + window, block bookkeeping, demotion
    decoder_from_frame: int  # 1-based first frame in ``decoder`` (a full window when the stream is long enough)
    ingest: Summary  # vision + decoder, frames 2..n
    mc: QuestionTiming
    open: QuestionTiming
    stats: EngineStats  # after the stream


def memory_config(adapter: LlavaOnevisionAdapter) -> MemoryConfig:
    """rekv with an 8-frame window, 12 frames resident and a 1 GiB host arena."""
    per_frame, sink = adapter.tokens_per_frame, len(adapter.prefix_ids())
    return MemoryConfig(
        policy="rekv",
        budget_tokens=sink + RESIDENT_FRAMES * per_frame,
        offload_bytes=OFFLOAD_BYTES,
        local_window_tokens=WINDOW_FRAMES * per_frame,
        retrieve_frames=RETRIEVE_FRAMES,
    )


def run(n_frames: int, repeats: int, seed: int, log=print) -> RealSizeResult:
    t0 = time.perf_counter()
    torch.manual_seed(seed)
    adapter = build_adapter(seed)
    build_s = time.perf_counter() - t0
    log(f"  real-size model built in {build_s:.1f} s")
    config = memory_config(adapter)
    engine = VideoMemoryEngine(adapter, config, GenerationConfig())
    samples = ingest_stream(engine, stream(n_frames, seed), on_frame=lambda i: log(f"  frame {i + 1}/{n_frames}"))
    # Frame k (1-based) attends to min(k - 1, window) earlier frames: steady state from frame window + 1.
    steady = WINDOW_FRAMES if n_frames > WINDOW_FRAMES + 1 else 1
    result = RealSizeResult(
        build_s=build_s,
        n_params=sum(p.numel() for p in adapter.model.parameters()),
        geometry=adapter.geometry,
        tokens_per_frame=adapter.tokens_per_frame,
        sink_tokens=len(adapter.prefix_ids()),
        config=config,
        n_frames=n_frames,
        vision=Summary.of(samples.vision_s[1:]),
        decoder=Summary.of(samples.decoder_s[steady:]),
        decoder_from_frame=steady + 1,
        ingest=Summary.of(samples.total_s[1:]),
        mc=time_question(engine, mc_question(), 1, repeats),
        open=time_question(engine, open_question(), 1, repeats),
        stats=engine.stats(),
    )
    engine.close()
    return result


def kv_bytes_per_frame(geometry: KVGeometry, tokens_per_frame: int, dtype: torch.dtype) -> int:
    """Bytes of one frame block's K and V over all layers, were the KV held in ``dtype``."""
    return tokens_per_frame * replace(geometry, dtype=dtype).bytes_per_token
