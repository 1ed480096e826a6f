"""Decide which camera frames enter memory, by header stamp.

Streaming Video-LLM memories (ReKV, StreamingVLM, ...) encode 0.5 frames per
second: a 30 fps camera would fill any KV budget in seconds and add almost no
information. The decision uses the message header stamp in integer nanoseconds,
never the wall clock, so a replayed bag or a simulator gives the same frames as
the live robot did (NVIDIA's remembr breaks under replay for using ``time.time()``).

Semantics, per camera:
- the first frame offered is accepted;
- afterwards a frame is accepted when
  ``stamp_ns >= last_accepted_ns + period_ns - tolerance_ns``, else skipped. The
  tolerance (1 ms) absorbs stamp jitter: 30 fps sampled at 0.5 fps gives the frame
  stamped at 2 s, 4 s, ... and never drifts to the next frame after a 0.1 ms early one;
- a stamp older than the newest one seen is STALE if it is at most
  ``reset_backward_s`` older (out-of-order delivery), and dropped; if it is more
  than that older the clock was reset (bag loop, simulator restart): the frame is
  accepted as RESET and the camera's history restarts from it;
- ``sample_fps <= 0`` accepts every frame whose stamp is newer than the last
  accepted one (a repeated stamp is skipped, stale ones are still dropped);
- an accepted frame that then cannot be decoded is handed back (``give_back``): the
  camera's next frame newer than it is accepted, so a corrupt frame costs its camera
  one frame, not a whole sampling period.

Invariant: between resets the accepted stamps of a camera strictly increase, and
those not given back are spaced by at least ``period_ns - tolerance_ns`` (config
guarantees > 0).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import operator
import threading
from dataclasses import dataclass, field

from videokv_node.config_base import param

NS_PER_S = 1_000_000_000


def stamp_to_ns(sec: int, nanosec: int) -> int:
    """builtin_interfaces/Time fields -> integer nanoseconds, exactly (no float on the way)."""
    if not 0 <= nanosec < NS_PER_S:
        raise ValueError(f"nanosec must be in [0, 1e9), got {nanosec}")
    return operator.index(sec) * NS_PER_S + operator.index(nanosec)


class SampleDecision(enum.Enum):
    """What the sampler did with one offered frame."""

    ACCEPT = "accept"  # enters memory
    SKIP = "skip"  # too soon after the last accepted frame of its camera
    STALE = "stale"  # older than a frame already seen, by at most reset_backward_s; dropped
    RESET = "reset"  # clock jumped back more than reset_backward_s; enters memory, history rebased

    @property
    def admitted(self) -> bool:
        """True when the frame should enter memory (ACCEPT or RESET)."""
        return self is SampleDecision.ACCEPT or self is SampleDecision.RESET


@dataclass(frozen=True, slots=True)
class SamplerConfig:
    """Frame sampling settings; the ROS parameters ``sample_*`` map onto these fields one to one."""

    sample_fps: float = param(0.5, "frames per second per camera entering memory, by header stamp; 0 = every frame", runtime=True, unbounded=True)  # <= 0 keeps every frame
    tolerance_s: float = param(0.001, "slack on the sampling period so camera jitter never skips a sample", runtime=True)  # early arrival still on time
    reset_backward_s: float = param(2.0, "a stamp jumping back more than this is a clock reset (bag loop), not a stale frame")

    def __post_init__(self) -> None:
        for name in ("sample_fps", "tolerance_s", "reset_backward_s"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite, got {getattr(self, name)}")
        if self.tolerance_s < 0:
            raise ValueError(f"tolerance_s must be >= 0, got {self.tolerance_s}")
        if self.reset_backward_s <= 0:
            raise ValueError(f"reset_backward_s must be > 0, got {self.reset_backward_s}")
        if self.sample_fps > 0 and self.tolerance_ns >= self.period_ns:
            raise ValueError(
                f"tolerance_s {self.tolerance_s} must be below the sampling period "
                f"{self.period_ns / NS_PER_S} s (1 / sample_fps {self.sample_fps})"
            )

    @property
    def period_ns(self) -> int:
        """Nanoseconds between accepted frames; 0 when every frame is kept."""
        return round(NS_PER_S / self.sample_fps) if self.sample_fps > 0 else 0

    @property
    def tolerance_ns(self) -> int:
        return round(self.tolerance_s * NS_PER_S)

    @property
    def reset_backward_ns(self) -> int:
        return round(self.reset_backward_s * NS_PER_S)


@dataclass(slots=True)
class CameraCounters:
    """Counts of one camera since the last ``reset``.

    Invariant: offered == accepted + skipped + stale, resets <= accepted (a RESET
    frame is counted in both accepted and resets), and given_back <= accepted.
    """

    offered: int = 0
    accepted: int = 0
    skipped: int = 0
    stale: int = 0
    resets: int = 0
    given_back: int = 0  # accepted, then handed back by ``FrameSampler.give_back`` (could not be decoded)

    def count(self, decision: SampleDecision) -> None:
        self.offered += 1
        self.accepted += decision.admitted
        self.skipped += decision is SampleDecision.SKIP
        self.stale += decision is SampleDecision.STALE
        self.resets += decision is SampleDecision.RESET


@dataclass(slots=True)
class _CameraState:
    last_accepted_ns: int  # stamp of the last admitted frame; spacing is measured from it
    latest_ns: int  # newest stamp offered; staleness and resets are measured from it
    slot_open: bool = False  # the last accepted frame was given back: the next newer frame is due at once
    counters: CameraCounters = field(default_factory=CameraCounters)


class FrameSampler:
    """Per-camera stamp-based frame sampler; safe to call from parallel ROS callbacks.

    All state is guarded by one lock, so each ``offer`` sees the effect of every
    earlier one and decisions for one camera are as if offers were serialised.
    """

    def __init__(self, config: SamplerConfig | None = None) -> None:
        self.config = config if config is not None else SamplerConfig()
        self._lock = threading.Lock()
        self._cameras: dict[str, _CameraState] = {}

    def set_config(self, config: SamplerConfig) -> None:
        """Use ``config`` from the next ``offer`` on (a run-time parameter change); cameras keep their history."""
        with self._lock:
            self.config = config

    def offer(self, camera: str, stamp_ns: int) -> SampleDecision:
        """Decide about a frame of ``camera`` stamped ``stamp_ns`` (integer ns; floats refused)."""
        stamp_ns = operator.index(stamp_ns)  # a float stamp would lose ns precision after ~104 days
        with self._lock:
            state = self._cameras.get(camera)
            if state is None:
                state = self._cameras[camera] = _CameraState(stamp_ns, stamp_ns)
                decision = SampleDecision.ACCEPT
            else:
                decision = self._decide(state, stamp_ns)
            state.counters.count(decision)
        return decision

    def _decide(self, state: _CameraState, stamp_ns: int) -> SampleDecision:
        cfg = self.config
        if stamp_ns < state.latest_ns:
            if state.latest_ns - stamp_ns <= cfg.reset_backward_ns:
                return SampleDecision.STALE
            state.latest_ns = state.last_accepted_ns = stamp_ns
            state.slot_open = False
            return SampleDecision.RESET
        state.latest_ns = stamp_ns
        # With sample_fps > 0 the first test implies the second (tolerance < period);
        # with sample_fps <= 0 (period 0, any tolerance) the second refuses repeated stamps.
        due = state.slot_open or stamp_ns >= state.last_accepted_ns + cfg.period_ns - cfg.tolerance_ns
        if due and stamp_ns > state.last_accepted_ns:
            state.last_accepted_ns = stamp_ns
            state.slot_open = False
            return SampleDecision.ACCEPT
        return SampleDecision.SKIP

    def give_back(self, camera: str, stamp_ns: int) -> bool:
        """Hand back the admission of ``camera``'s frame stamped ``stamp_ns`` (it could not be decoded).

        The camera's next frame with a newer stamp is then accepted whatever the period,
        as if the bad frame had not been sampled. Only the camera's last admitted frame
        can be given back, once; anything else returns False and changes nothing.
        """
        stamp_ns = operator.index(stamp_ns)
        with self._lock:
            state = self._cameras.get(camera)
            if state is None or state.slot_open or state.last_accepted_ns != stamp_ns:
                return False
            state.slot_open = True
            state.counters.given_back += 1
            return True

    def counters(self) -> dict[str, CameraCounters]:
        """A snapshot (copies) of every camera's counters."""
        with self._lock:
            return {cam: dataclasses.replace(s.counters) for cam, s in self._cameras.items()}

    def reset(self, camera: str | None = None) -> None:
        """Forget one camera (or all): its next frame is accepted as a first frame, counters restart."""
        with self._lock:
            if camera is None:
                self._cameras.clear()
            else:
                self._cameras.pop(camera, None)
