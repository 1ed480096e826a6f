"""Ingest's first stage, apart from the decoder: still frames merged, the others through the vision encoder.

Why apart (issue 33, docs/bench/load.md): one frame costs the vision encoder (about 70 ms for
videokv-tiny's EfficientNet on a CPU core) and then the decoder's prefill (about 200 ms), one after
the other on the node's model worker; on a machine with cores to spare the two can overlap. On the
project's 2 cores, busy with eight camera drivers, it gained 0-5%, so the node's ``vision.own_thread``
is off by default. ``VideoMemoryEngine.prepare`` (the still-frame test, then ``start_vision``) makes a ``PreparedFrames`` on the engine's thread
(the still-frame test reads and extends the memory, so it stays there) and hands the vision
encoder's work to ``vision`` if one is given (``vision_thread()``'s ``submit``): the model worker
prepares the next queued frames, then runs the decoder over the batch before them while the vision
thread encodes (``runtime/worker.py``). ``ingest_prepared`` waits for the features and does the
rest, as ``ingest`` always did.

What is guaranteed: every vision call of an engine's worker runs on the one vision thread (a
TensorRT execution context is never used by two threads), the decoder sees the batches in the
order they were prepared, and the memory after a batch is exactly what ``ingest`` of the same
frames makes. What differs from ``ingest`` one batch at a time: a batch's still-frame test runs
before the previous batch's decoder pass, not after it. The test already ran for a whole batch
before its own decoder pass; the overlap makes that two batches: a still frame may extend the span
of a stored frame that the pass in between then evicts (the frame leaves memory with the span it
joined, counted in ``frames_merged``), where one batch at a time it would have been stored anew.
That needs the policy to evict a camera's newest stored frame within one batch of it arriving.

On a GPU both threads use torch's default stream: their kernels are ordered on the device as one
thread's would be, and the overlap is the CPU's work (preprocessing, launches).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch

from videokv_node.memory.records.clock import elapsed_s
from videokv_node.memory.question import Frame
from videokv_node.models.adapter import VideoLLMAdapter

VisionResult = tuple[torch.Tensor, float]  # (F, T, hidden) features, vision milliseconds per frame


@dataclass(slots=True)
class PreparedFrames:
    """Frames past the first stage: those to encode (still ones merged already) and their features to come."""

    frames: list[Frame]  # the frames the decoder will encode, time order
    vision: Future  # resolves to a VisionResult; done already where no vision thread was given


def encode_vision(adapter: VideoLLMAdapter, frames: list[Frame]) -> VisionResult:
    """The vision encoder over ``frames``, and its time per frame (waiting for the device)."""
    t0 = time.perf_counter()
    feats = adapter.encode_frames([f.rgb for f in frames])
    return feats, elapsed_s(t0, adapter.device) * 1e3 / len(frames)


def run_now(work: Callable[[], VisionResult]) -> Future:
    """``work`` run on this thread, as a done future (its exception held for ``result()``)."""
    future: Future = Future()
    try:
        future.set_result(work())
    except Exception as exc:
        future.set_exception(exc)
    return future


def start_vision(adapter: VideoLLMAdapter, frames: list[Frame], vision: Callable[[Callable], Future] | None = None) -> PreparedFrames:
    """The vision encoder over ``frames`` (still ones already merged) run now, or submitted through ``vision``
    (``vision_thread().submit``): ingest's first stage once the still-frame test has run."""
    if not frames:
        return PreparedFrames([], run_now(lambda: (None, 0.0)))
    return PreparedFrames(frames, (vision or run_now)(partial(encode_vision, adapter, frames)))


def vision_thread() -> ThreadPoolExecutor:
    """The one thread that runs an engine worker's vision calls, in the order submitted (``submit``); its
    ``shutdown(wait=False, cancel_futures=True)`` cancels what has not started and lets the running call end."""
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="videokv-vision")
