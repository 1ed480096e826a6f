"""The node's health, computed from plain numbers: testable without ROS.

``HealthMonitor`` is fed by the node (a frame received on a camera, at the node
clock's time) and asked for a report with the node's cumulative counters; it
keeps a sliding window on the node clock only (never wall time), so it follows
``use_sim_time`` and bag replay. ``ros/diagnostics.py`` turns a report into a
``diagnostic_msgs/DiagnosticArray``.

Levels and reasons:
- camera ERROR when silent longer than ``silence_error_s``, WARN longer than
  ``silence_warn_s``; a camera that sends again is OK at the next report (no restart);
- memory WARN when more than ``drop_warn_ratio`` (default ``DROP_WARN_RATIO``) of the sampled frames in the window
  were dropped from the full frame queue (ingest falls behind the sample rate);
- memory WARN when blocks were evicted in the window (budget exhausted: the memory
  is at its cap and forgets);
- memory ERROR when the model worker thread has died (nothing is ingested any more).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from enum import IntEnum

from videokv_node.memory.stats import EngineStats

NS = 1_000_000_000
# Above this share of sampled frames dropped from the full queue, ingest cannot keep up with
# sample_fps: 10% tolerates the odd burst (a question preempting a few frames) but not a
# model that is steadily slower than the cameras.
DROP_WARN_RATIO = 0.10


class Level(IntEnum):
    """Same values as diagnostic_msgs/DiagnosticStatus OK, WARN, ERROR."""

    OK = 0
    WARN = 1
    ERROR = 2


@dataclass(frozen=True, slots=True)
class HealthConfig:
    silence_warn_s: float = 2.0  # a camera silent longer than this is WARN
    silence_error_s: float = 5.0  # ... and longer than this ERROR
    window_s: float = 5.0  # rates are averaged over this much node-clock time
    drop_warn_ratio: float = DROP_WARN_RATIO  # WARN above this share of sampled frames dropped from the full queue

    def __post_init__(self) -> None:
        if not 0 < self.silence_warn_s <= self.silence_error_s:
            raise ValueError("need 0 < diagnostics_silence_warn_s <= diagnostics_silence_error_s")
        if not 0 <= self.drop_warn_ratio < 1:
            raise ValueError("diagnostics_drop_warn_ratio must be in [0, 1)")
        if self.window_s <= 0:
            raise ValueError("window_s must be > 0")


@dataclass(frozen=True, slots=True)
class ModelInfo:
    name: str  # NodeSettings.model
    device: str  # e.g. 'cpu', 'cuda:0'
    dtype: str  # e.g. 'torch.float32'
    policy: str  # memory policy
    vision_backend: str = "torch"  # VisionBackend.name: tensorrt:fp16, onnxruntime:CUDA, torch:cuda:0, ...


@dataclass(frozen=True, slots=True)
class Status:
    """One diagnostic status: a level, the reasons in ``message``, values as strings."""

    name: str
    level: Level
    message: str
    values: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Totals:
    """Cumulative counters at one report, for window deltas."""

    t_ns: int
    sampled: int
    overflowed: int
    dropped: int
    ingested: int
    evicted: int


class HealthMonitor:
    """Per-camera rates and silence, ingest and memory health over a node-clock window.

    Thread-safe: ``frame_received`` comes from camera callbacks, ``report`` from a timer.
    Invariants: only events within the last ``window_s`` count towards a rate; a clock
    going back (bag loop, sim reset) clears the history instead of producing negative
    ages; a camera never heard from is silent since the monitor's first clock reading.
    """

    def __init__(self, cameras: list[str] | tuple[str, ...] = (), config: HealthConfig | None = None) -> None:
        self.config = config or HealthConfig()
        self._lock = threading.Lock()
        self._start_ns: int | None = None  # first non-zero clock reading (sim time starts at 0)
        self._last_ns = 0
        self._arrivals: dict[str, deque[int]] = {c: deque() for c in cameras}  # receive times in the window
        self._last_seen: dict[str, int | None] = {c: None for c in cameras}
        self._totals: deque[_Totals] = deque()

    def set_config(self, config: HealthConfig) -> None:
        """New thresholds (run-time parameters), used from the next report; the history is kept."""
        with self._lock:
            self.config = config

    def add_camera(self, camera: str) -> None:
        with self._lock:
            self._arrivals.setdefault(camera, deque())
            self._last_seen.setdefault(camera, None)

    def frame_received(self, camera: str, now_ns: int) -> None:
        """A frame arrived on ``camera`` at node-clock time ``now_ns`` (before decoding or sampling)."""
        with self._lock:
            self._observe(now_ns)
            self._arrivals.setdefault(camera, deque()).append(now_ns)
            self._last_seen[camera] = now_ns

    def report(
        self,
        now_ns: int,
        stats: EngineStats,
        counters: dict[str, int],
        frames_overflowed: int,
        queue_depth: int,
        queue_size: int,
        model: ModelInfo,
        worker_alive: bool = True,
        device_memory: dict[str, str] | None = None,
    ) -> list[Status]:
        """One status per camera (sorted by name), then the memory/model status."""
        with self._lock:
            self._observe(now_ns)
            cameras = [self._camera_status(c, now_ns) for c in sorted(self._arrivals)]
            memory = self._memory_status(now_ns, stats, counters, frames_overflowed, queue_depth, queue_size,
                                         model, worker_alive, device_memory or {})
        return [*cameras, memory]

    # --- under the lock ---------------------------------------------------
    def _observe(self, now_ns: int) -> None:
        if now_ns <= 0:  # sim time before the first /clock: nothing to measure against
            return
        if self._start_ns is None or now_ns < self._last_ns:  # first reading, or the clock went back
            self._start_ns = now_ns
            for q in self._arrivals.values():
                q.clear()
            self._last_seen = {c: None for c in self._last_seen}
            self._totals.clear()
        self._last_ns = now_ns
        horizon = now_ns - int(self.config.window_s * NS)
        for q in self._arrivals.values():
            while q and q[0] < horizon:
                q.popleft()

    def _span_s(self, now_ns: int) -> float:
        """Seconds the window really covers (shorter right after start)."""
        start = self._start_ns if self._start_ns is not None else now_ns
        return min(self.config.window_s, (now_ns - start) / NS)

    def _camera_status(self, camera: str, now_ns: int) -> Status:
        cfg = self.config
        span = self._span_s(now_ns)
        rate = len(self._arrivals[camera]) / span if span > 0 else 0.0
        last = self._last_seen[camera]
        since = last if last is not None else (self._start_ns or now_ns)
        silent_s = max(0.0, (now_ns - since) / NS)
        heard = "no frame yet" if last is None else "no frame"
        if silent_s > cfg.silence_error_s:
            level, message = Level.ERROR, f"silent: {heard} for {silent_s:.1f} s (> {cfg.silence_error_s} s)"
        elif silent_s > cfg.silence_warn_s:
            level, message = Level.WARN, f"silent: {heard} for {silent_s:.1f} s (> {cfg.silence_warn_s} s)"
        elif last is None:
            level, message = Level.OK, "waiting for the first frame"
        else:
            level, message = Level.OK, f"receiving at {rate:.1f} Hz"
        values = {"topic": camera, "input_rate_hz": f"{rate:.2f}", "silent_s": f"{silent_s:.2f}",
                  "last_frame_age_s": "never" if last is None else f"{silent_s:.2f}"}
        return Status(f"videokv: camera {camera}", level, message, values)

    def _memory_status(self, now_ns, stats, counters, overflowed, queue_depth, queue_size, model, worker_alive,
                       device_memory) -> Status:
        now = _Totals(now_ns, counters.get("sampled", 0), overflowed, counters.get("dropped", 0),
                      stats.frames_ingested, stats.frames_evicted)
        self._totals.append(now)
        horizon = now_ns - int(self.config.window_s * NS)
        while len(self._totals) > 1 and self._totals[1].t_ns <= horizon:  # keep one sample at or before the horizon
            self._totals.popleft()
        old = self._totals[0]
        span = (now.t_ns - old.t_ns) / NS
        sampled, overflow = now.sampled - old.sampled, now.overflowed - old.overflowed
        evicted = now.evicted - old.evicted
        overflow_ratio = overflow / sampled if sampled > 0 else 0.0

        reasons, level = [], Level.OK
        if not worker_alive:
            level = Level.ERROR
            reasons.append("model worker stopped: nothing is ingested")
        if overflow_ratio > self.config.drop_warn_ratio:
            level = max(level, Level.WARN)
            reasons.append(f"ingest falling behind the sample rate: {overflow_ratio:.0%} of sampled frames dropped "
                           f"from the full queue (> {self.config.drop_warn_ratio:.0%})")
        if evicted > 0:
            level = max(level, Level.WARN)
            reasons.append(f"budget exhausted: {evicted} blocks evicted in the last {span:.1f} s")

        per_s = (lambda n: f"{n / span:.2f}") if span > 0 else (lambda n: "0.00")
        values = {
            "policy": model.policy,
            "model": model.name,
            "model_device": model.device,
            "model_dtype": model.dtype,
            "model_state": "running" if worker_alive else "stopped",
            "vision_backend": model.vision_backend,
            "queue_depth": str(queue_depth),
            "queue_size": str(queue_size),
            "sampled_rate_hz": per_s(sampled),
            "ingest_rate_hz": per_s(now.ingested - old.ingested),
            "drop_rate_hz": per_s(now.dropped - old.dropped),
            "queue_drop_ratio": f"{overflow_ratio:.3f}",
            "eviction_rate_hz": per_s(evicted),
            "tokens_resident": str(stats.tokens_resident),
            "budget_tokens": str(stats.budget_tokens),
            "resident_fill": _fill(stats.tokens_resident, stats.budget_tokens),
            "bytes_offloaded": str(stats.bytes_offloaded),
            "budget_offload_bytes": str(stats.budget_offload_bytes),
            "offload_fill": _fill(stats.bytes_offloaded, stats.budget_offload_bytes),
            "frames_in_memory": str(stats.frames_in_memory),
            "ingest_ms_p95": f"{stats.ingest_ms_p95:.1f}",
            **device_memory,
        }
        return Status("videokv: memory", level, "; ".join(reasons) or "ok", values)


def _fill(used: int, cap: int) -> str:
    return f"{used / cap:.3f}" if cap > 0 else "n/a"


def device_memory(device: str) -> dict[str, str]:
    """torch's allocated / reserved bytes on a CUDA device; ``{'device_memory': 'cpu'}`` otherwise."""
    import torch

    if not device.startswith("cuda") or not torch.cuda.is_available():
        return {"device_memory": "cpu"}
    return {"device_memory_allocated_bytes": str(torch.cuda.memory_allocated(device)),
            "device_memory_reserved_bytes": str(torch.cuda.memory_reserved(device))}


def free_device_memory() -> None:
    """Return freed tensors' device memory to the driver, so the figures (and other processes) see it."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
