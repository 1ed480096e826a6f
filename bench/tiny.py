"""Latency of the tiny model at several memory sizes, per policy.

One case = one policy holding N frames. The engine's caps are set so that
memory holds exactly N frames: ``full`` keeps N resident; ``rekv`` keeps
``REKV_RESIDENT_FRAMES`` resident (its 8-frame local window and 8 more) and
N - 16 in a host arena sized for exactly that many blocks. The stream is N + M
frames: the first N fill memory and are the warm-up; the M after them are
timed at steady state (memory full, one block demoted or evicted per frame).
Then each question is asked ``warmup + repeats`` times on the unchanged memory.

The tiny model (2 layers, 16 tokens per frame, random weights) makes the
engine's own overheads visible; its timings say nothing about a real model's.
"""

from __future__ import annotations

from dataclasses import dataclass

from videokv_node.memory import EngineStats, GenerationConfig, MemoryConfig, VideoMemoryEngine
from videokv_node.models.llava_onevision import LlavaOnevisionAdapter

from bench.timing import Summary
from bench.workload import QuestionTiming, ingest_stream, mc_question, open_question, stream, time_question

WINDOW_FRAMES = 8  # rekv's local window while encoding, and the recent frames every question keeps
RETRIEVE_FRAMES = 8  # rekv: frame blocks retrieved per layer for a question
REKV_RESIDENT_FRAMES = 16  # rekv: frames on the model's device; the rest of memory is offloaded
PAGE_TOKENS = 16
QUESTION_WARMUP = 1


@dataclass(frozen=True, slots=True)
class TinyCase:
    policy: str  # "full" or "rekv"
    frames_in_memory: int  # N: frames memory holds once full
    config: MemoryConfig
    ingest: Summary  # engine.ingest of one frame, at steady state
    vision: Summary  # the vision path inside it
    mc: QuestionTiming
    open: QuestionTiming
    stats: EngineStats  # after the stream, before the questions


def memory_config(adapter: LlavaOnevisionAdapter, policy: str, n_frames: int) -> MemoryConfig:
    """Caps under which memory holds exactly ``n_frames`` frames of this adapter."""
    sink, per_frame = len(adapter.prefix_ids()), adapter.tokens_per_frame
    common = dict(local_window_tokens=WINDOW_FRAMES * per_frame, page_tokens=PAGE_TOKENS)
    if policy == "full":
        return MemoryConfig(policy="full", budget_tokens=sink + n_frames * per_frame, offload_bytes=0, **common)
    if n_frames <= REKV_RESIDENT_FRAMES:
        raise ValueError(f"rekv cases need more than {REKV_RESIDENT_FRAMES} frames in memory, got {n_frames}")
    page_bytes = PAGE_TOKENS * adapter.geometry.bytes_per_token
    pages_per_frame = -(-per_frame // PAGE_TOKENS)
    return MemoryConfig(
        policy="rekv",
        budget_tokens=sink + REKV_RESIDENT_FRAMES * per_frame,
        offload_bytes=(n_frames - REKV_RESIDENT_FRAMES) * pages_per_frame * page_bytes,
        retrieve_frames=RETRIEVE_FRAMES,
        **common,
    )


def run_case(
    adapter: LlavaOnevisionAdapter, policy: str, n_frames: int, measured_frames: int, repeats: int, seed: int
) -> TinyCase:
    config = memory_config(adapter, policy, n_frames)
    engine = VideoMemoryEngine(adapter, config, GenerationConfig())
    samples = ingest_stream(engine, stream(n_frames + measured_frames, seed))
    stats = engine.stats()
    if stats.frames_in_memory != n_frames:
        raise RuntimeError(f"{policy}: memory holds {stats.frames_in_memory} frames, the case needs {n_frames}")
    case = TinyCase(
        policy=policy,
        frames_in_memory=n_frames,
        config=config,
        ingest=Summary.of(samples.total_s[n_frames:]),
        vision=Summary.of(samples.vision_s[n_frames:]),
        mc=time_question(engine, mc_question(), QUESTION_WARMUP, repeats),
        open=time_question(engine, open_question(), QUESTION_WARMUP, repeats),
        stats=stats,
    )
    engine.close()
    return case
