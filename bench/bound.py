"""The memory bound as a figure: peaks over a long tiny stream against the configured caps.

The engine guarantees that resident tokens never exceed ``budget_tokens`` and
offloaded bytes never exceed ``offload_bytes`` after each ingest, however long
the stream (tests/unit/test_memory_caps.py checks it exactly on short streams).
Here the stream is thousands of frames and the peaks are read from
``engine.stats()`` after every frame; a peak over its cap fails the run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from videokv_node.memory import GenerationConfig, MemoryConfig, VideoMemoryEngine
from videokv_node.models.llava_onevision import LlavaOnevisionAdapter

from bench.workload import stream

WINDOW_FRAMES = 8
RESIDENT_FRAMES = 16  # budget: the prompt sink plus this many frames
OFFLOADED_FRAMES = 64  # rekv's host arena: exactly this many frame blocks
PAGE_TOKENS = 16


@dataclass(frozen=True, slots=True)
class BoundResult:
    policy: str
    n_frames: int  # frames streamed
    budget_tokens: int  # cap on resident tokens, sink included
    budget_bytes: int  # the same cap in bytes
    offload_cap_bytes: int  # the host arena's capacity (0: the policy never offloads)
    peak_tokens_resident: int
    peak_bytes_resident: int
    peak_tokens_offloaded: int
    peak_bytes_offloaded: int
    frames_in_memory: int  # at the end
    frames_evicted: int  # at the end
    rss_mib_early: float  # process resident set after 10% of the stream (model, interpreter and all)
    rss_mib_end: float  # after the whole stream: equal to the above up to noise when nothing leaks

    @property
    def within_caps(self) -> bool:
        return self.peak_tokens_resident <= self.budget_tokens and self.peak_bytes_offloaded <= self.offload_cap_bytes


def memory_config(adapter: LlavaOnevisionAdapter, policy: str) -> MemoryConfig:
    sink, per_frame = len(adapter.prefix_ids()), adapter.tokens_per_frame
    page_bytes = PAGE_TOKENS * adapter.geometry.bytes_per_token
    return MemoryConfig(
        policy=policy,
        budget_tokens=sink + RESIDENT_FRAMES * per_frame,
        offload_bytes=OFFLOADED_FRAMES * -(-per_frame // PAGE_TOKENS) * page_bytes,
        local_window_tokens=WINDOW_FRAMES * per_frame,
        page_tokens=PAGE_TOKENS,
    )


def run(adapter: LlavaOnevisionAdapter, policy: str, n_frames: int, seed: int) -> BoundResult:
    engine = VideoMemoryEngine(adapter, memory_config(adapter, policy), GenerationConfig())
    peaks = dict(tokens_resident=0, bytes_resident=0, tokens_offloaded=0, bytes_offloaded=0)
    rss_early = 0.0
    for i, frame in enumerate(stream(n_frames, seed)):
        engine.ingest([frame])
        stats = engine.stats()
        for key in peaks:
            peaks[key] = max(peaks[key], getattr(stats, key))
        if i + 1 == max(1, n_frames // 10):
            rss_early = _rss_mib()
    result = BoundResult(
        policy=policy,
        n_frames=n_frames,
        budget_tokens=stats.budget_tokens,
        budget_bytes=engine.store.entry_bytes(stats.budget_tokens * engine.adapter.geometry.n_layers),
        offload_cap_bytes=stats.budget_offload_bytes,
        peak_tokens_resident=peaks["tokens_resident"],
        peak_bytes_resident=peaks["bytes_resident"],
        peak_tokens_offloaded=peaks["tokens_offloaded"],
        peak_bytes_offloaded=peaks["bytes_offloaded"],
        frames_in_memory=stats.frames_in_memory,
        frames_evicted=stats.frames_evicted,
        rss_mib_early=rss_early,
        rss_mib_end=_rss_mib(),
    )
    engine.close()
    if not result.within_caps:
        raise AssertionError(f"memory over its caps: {result}")
    return result


def _rss_mib() -> float:
    """This process's current resident set size (Linux /proc), in MiB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
