"""``elapsed_s`` waits for a CUDA device before it reads the clock, and only for CUDA.

Checked on any machine: ``torch.cuda.synchronize`` and the clock are replaced by recorders, so the
order of the two calls is what is tested, not a GPU's timing.
"""

from __future__ import annotations

import torch

from videokv_node.memory.records import clock


def test_cuda_is_synchronised_before_the_clock_is_read(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("sync", str(device))))
    monkeypatch.setattr(clock.time, "perf_counter", lambda: calls.append(("clock",)) or 12.5)
    assert clock.elapsed_s(10.0, torch.device("cuda", 1)) == 2.5
    assert calls == [("sync", "cuda:1"), ("clock",)]


def test_the_cpu_reads_the_clock_only(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("sync",)))
    monkeypatch.setattr(clock.time, "perf_counter", lambda: calls.append(("clock",)) or 3.0)
    assert clock.elapsed_s(1.0, torch.device("cpu")) == 2.0
    assert calls == [("clock",)]
