"""Elapsed time of work that may still be running on an accelerator.

CUDA kernels run after the call that launched them returns: ``perf_counter`` read right after a
forward measures the launches, not the work. Every duration the engine reports (TTFT, per-frame
vision time) is read through ``elapsed_s``, which waits for the model's device first. On the CPU
it is ``perf_counter() - t0`` and nothing else.
"""

from __future__ import annotations

import time

import torch


def elapsed_s(t0: float, device: torch.device) -> float:
    """Seconds since ``t0`` (a ``time.perf_counter()`` reading), once ``device`` has finished its work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0
