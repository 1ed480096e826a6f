"""Frames parked until the robot's pose at their stamp is known, each for a bounded time.

With ``pose_source: tf`` a camera frame is usually newer than the newest transform (a
robot's tf comes at 10-50 Hz, tens of ms behind the image), so a lookup at the frame's
stamp right away would extrapolate and fail. The node therefore parks each sampled
frame here and lets it go as soon as its pose can be resolved, or when it has waited
``wait_ns``: then it gets whatever the caller's ``settle`` gives (the nearest pose within
``pose_tolerance_s``, or none with the reason). Nothing here blocks nor reads a clock:
the caller passes its clock's ``now_ns`` (the node clock, so sim time works) and calls
``release`` often (a timer, and after each ``park``), then hands what is released to the
model worker, which therefore never waits for tf and keeps answering questions.

Guarantees (``release`` called with a non-decreasing clock):
- an item leaves at the first ``release`` at or after ``wait_ns`` past its parking, or
  earlier if its pose resolves; a clock that goes back (a bag loop) lets every item parked
  before the jump go at the next ``release``;
- items of one key (a camera) leave in the order they were parked, so a camera's frames
  reach the memory in stamp order; items of different keys never wait for each other;
- at most ``capacity`` items stay parked: the oldest beyond it leave at the next
  ``release`` as if their wait were over (counted in ``overflowed``);
- every parked item leaves exactly once: by ``release`` or by ``drain``.
Not thread-safe: the caller serialises ``park``, ``release`` and ``drain`` (one lock).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from videokv_node.pose import Pose


@dataclass(slots=True)
class Parked:
    """One item waiting for its pose."""

    key: Hashable  # items of one key leave in parking order (the camera)
    stamp_ns: int  # the stamp whose pose is wanted (the frame's header stamp)
    item: Any  # what the caller gets back (the frame)
    parked_ns: int  # the caller's clock when parked
    missed: bool = False  # set by ``release`` once the item stays (its pose did not resolve, or an earlier one's of its key)


@dataclass(slots=True)
class Released:
    """An item leaving, with its pose (None: none) and why it has that pose."""

    item: Any
    stamp_ns: int
    pose: Pose | None
    reason: str  # "resolved" (the pose at the stamp), else ``settle``'s reason
    waited_ns: int  # on the caller's clock, from park to release (0 when the clock went back)
    waited: bool  # it did not leave at the first ``release`` after ``park``: it waited (for its pose or its key's order)


class PoseWait:
    """Items parked by stamp until ``resolve(stamp)`` gives a pose or their wait is over (module docstring)."""

    def __init__(self, wait_ns: int, capacity: int) -> None:
        if wait_ns < 0 or capacity < 1:
            raise ValueError(f"wait_ns must be >= 0 and capacity >= 1, got {wait_ns}, {capacity}")
        self.wait_ns = wait_ns
        self.capacity = capacity
        self._parked: deque[Parked] = deque()  # parking order
        self.overflowed = 0  # items let go before their wait was over because ``capacity`` were parked

    def __len__(self) -> int:
        return len(self._parked)

    def park(self, key: Hashable, stamp_ns: int, item: Any, now_ns: int) -> None:
        """Park ``item`` until its pose at ``stamp_ns`` resolves or ``wait_ns`` passes; never refuses."""
        self._parked.append(Parked(key, stamp_ns, item, now_ns))

    def release(
        self,
        resolve: Callable[[int], Pose | None],
        settle: Callable[[int], tuple[Pose | None, str]],
        now_ns: int,
    ) -> list[Released]:
        """Let go, in parking order, every item whose pose resolves now or whose wait is over.

        ``resolve(stamp)`` is the pose at the stamp if it can be known now, else None (it will be
        asked again). ``settle(stamp)`` is the final answer for an item whose wait is over: a pose
        (the nearest) or None, and the reason. Neither may raise.
        """
        forced = max(0, len(self._parked) - self.capacity)  # the oldest beyond capacity leave now
        self.overflowed += forced
        blocked: set[Hashable] = set()  # keys with an earlier item still parked
        kept: deque[Parked] = deque()
        out: list[Released] = []
        for i, p in enumerate(self._parked):
            if p.key in blocked:
                p.missed = True
                kept.append(p)
                continue
            waited = now_ns - p.parked_ns
            over = i < forced or waited >= self.wait_ns or waited < 0
            pose, reason = resolve(p.stamp_ns), "resolved"
            if pose is None and over:
                pose, reason = settle(p.stamp_ns)
            elif pose is None:
                p.missed = True
                blocked.add(p.key)
                kept.append(p)
                continue
            out.append(Released(p.item, p.stamp_ns, pose, reason, max(0, waited), p.missed))
        self._parked = kept
        return out

    def drain(self) -> list[Any]:
        """Every parked item, in parking order, now unparked (a deactivation or a memory reset)."""
        items = [p.item for p in self._parked]
        self._parked.clear()
        return items
