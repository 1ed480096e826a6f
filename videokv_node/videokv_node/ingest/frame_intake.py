"""What a camera frame goes through before the model queue: check, sample, decode; counted per camera.

A robot's cameras publish far more than memory keeps (four cameras at 15 Hz, 0.5 frames
per second sampled: one frame in 30), so the order is what makes intake cheap:

1. ``check``: the message's sizes, encoding and data length (raw) or format and
   signature (compressed), no pixel touched. A malformed frame is counted and dropped
   here, whether or not it would have been sampled, and never takes a sample slot.
2. the sampler decides by header stamp (``FrameSampler.offer``); a skipped frame costs
   nothing more.
3. ``decode``: only a sampled frame. One that fails (a JPEG whose body is corrupt: only
   decompression finds it) is counted and dropped, and gives its slot back
   (``FrameSampler.give_back``), so the camera's next frame takes its place.

Invariant, per camera: received == malformed + skipped + stale + undecodable + sampled,
each outcome counted once, under one lock (callbacks of several cameras run in parallel).
No ROS here: the node passes the two steps as callables over the message.
"""

from __future__ import annotations

import enum
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from videokv_node.ingest.image_decode import ImageDecodeError
from videokv_node.ingest.sampler import FrameSampler, SampleDecision


class Outcome(enum.Enum):
    """What intake did with one frame; the value is its per-camera counter's name."""

    MALFORMED = "malformed"  # refused by the cheap check: dropped, no decode, no sample slot
    SKIPPED = "skipped"  # not due by the sampler: no decode (not a drop: sampling is the point)
    STALE = "stale"  # older than a frame already seen (out of order): dropped
    UNDECODABLE = "undecodable"  # sampled, then failed to decode: dropped, its slot given back
    SAMPLED = "sampled"  # decoded: goes to the model queue


@dataclass(frozen=True, slots=True)
class IntakeResult:
    """One frame's outcome; ``rgb`` is set for SAMPLED only, ``reason``/``message`` for the two decode failures."""

    outcome: Outcome
    decision: SampleDecision | None = None  # the sampler's, None when the check refused the frame
    rgb: np.ndarray | None = None  # (H, W, 3) uint8, owning its memory
    reason: str = ""  # ImageDecodeError.reason
    message: str = ""  # the error in words


class FrameIntake:
    """Per-camera check -> sample -> decode, with counts by outcome and reason; thread-safe."""

    def __init__(self, sampler: FrameSampler) -> None:
        self.sampler = sampler
        self._lock = threading.Lock()
        self._counts: dict[str, Counter] = {}  # camera -> counter name -> count

    def offer(self, camera: str, stamp_ns: int, check: Callable[[], object],
              decode: Callable[[], np.ndarray]) -> IntakeResult:
        """Take one frame of ``camera``: ``check()`` and ``decode()`` raise ImageDecodeError for a bad frame.

        ``decode`` runs only for a frame the sampler admitted (ACCEPT or RESET).
        """
        try:
            check()
        except ImageDecodeError as exc:
            return self._counted(camera, IntakeResult(Outcome.MALFORMED, reason=exc.reason, message=str(exc)))
        decision = self.sampler.offer(camera, stamp_ns)
        if decision is SampleDecision.STALE:
            return self._counted(camera, IntakeResult(Outcome.STALE, decision))
        if not decision.admitted:
            return self._counted(camera, IntakeResult(Outcome.SKIPPED, decision))
        try:
            rgb = decode()
        except ImageDecodeError as exc:
            self.sampler.give_back(camera, stamp_ns)
            return self._counted(camera, IntakeResult(Outcome.UNDECODABLE, decision, reason=exc.reason, message=str(exc)))
        return self._counted(camera, IntakeResult(Outcome.SAMPLED, decision, rgb))

    def count(self, camera: str, key: str, n: int = 1) -> None:
        """Add ``n`` to a counter of ``camera`` that a later stage keeps (e.g. ``dropped_deactivated``)."""
        with self._lock:
            self._counts.setdefault(camera, Counter())[key] += n

    def counts(self) -> dict[str, dict[str, int]]:
        """A snapshot: camera -> counter -> count. Keys: ``received``, each outcome's name, and
        ``malformed_<reason>`` / ``undecodable_<reason>`` per ImageDecodeError reason."""
        with self._lock:
            return {camera: dict(c) for camera, c in self._counts.items()}

    def _counted(self, camera: str, result: IntakeResult) -> IntakeResult:
        with self._lock:
            c = self._counts.setdefault(camera, Counter())
            c["received"] += 1
            c[result.outcome.value] += 1
            if result.reason:
                c[f"{result.outcome.value}_{result.reason}"] += 1
        return result
