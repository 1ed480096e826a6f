"""What a long-replay job is, in library types: frames with stamps and cameras, questions, answers, timings.

Rank 0 builds a ``ReplayJob`` from a ROS goal (``programs/long_replay.py``) and sends it to
the other ranks over torch.distributed (``broadcast_object_list``: these are plain
picklable dataclasses). ``ReplayOutcome`` carries what the action's result reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from videokv_node.memory.config import DEFAULT_OPTION_SCORING, OPTION_SCORINGS, check_choice


@dataclass(frozen=True, slots=True)
class ReplayQuestion:
    """One question; the fields of AskVideo's request. Times in ns, 0 = open end."""

    question: str
    options: tuple[str, ...] = ()
    cameras: tuple[str, ...] = ()  # empty: every camera of the replay
    since_ns: int = 0
    until_ns: int = 0
    max_new_tokens: int = 0  # 0: the service's default
    option_scoring: str = DEFAULT_OPTION_SCORING  # multiple choice: one of memory/config.py OPTION_SCORINGS


@dataclass(slots=True)
class ReplayJob:
    """Frames in time order (RGB uint8 (H, W, 3)), their header stamps and cameras, and the questions."""

    frames: list[np.ndarray]
    stamps_ns: list[int]
    cameras: list[str]
    questions: list[ReplayQuestion]

    def check(self, max_frames: int) -> None:
        """Raise ValueError with the reason if the job cannot run (the goal is then answered success=false)."""
        if not self.questions:
            raise ValueError("a long replay needs at least one question")
        if not self.frames:
            raise ValueError("no frames to replay")
        if not (len(self.frames) == len(self.stamps_ns) == len(self.cameras)):
            raise ValueError("frames, stamps and cameras differ in length")
        if len(self.frames) > max_frames:
            raise ValueError(f"{len(self.frames)} frames exceed the service's limit of {max_frames}")
        if any(b < a for a, b in zip(self.stamps_ns, self.stamps_ns[1:])):
            raise ValueError("frames are not in header-stamp order")
        for q in self.questions:
            if not q.question.strip():
                raise ValueError("an empty question")
            if q.until_ns and q.since_ns > q.until_ns:
                raise ValueError(f"question {q.question!r}: since is after until")
            check_choice(f"question {q.question!r}: option_scoring", q.option_scoring, OPTION_SCORINGS)  # ConfigError: a ValueError

    def frames_for(self, q: ReplayQuestion) -> list[int]:
        """Indices of the frames in the question's time window and cameras."""
        return [i for i, (t, cam) in enumerate(zip(self.stamps_ns, self.cameras))
                if (not q.cameras or cam in q.cameras) and t >= q.since_ns and (not q.until_ns or t <= q.until_ns)]


@dataclass(slots=True)
class ReplayAnswer:
    """AskVideo's response fields for one question."""

    success: bool
    message: str = ""
    answer: str = ""
    option_index: int = -1
    option_scores: list[float] = field(default_factory=list)
    evidence_stamps_ns: list[int] = field(default_factory=list)
    evidence_cameras: list[str] = field(default_factory=list)
    ttft_s: float = 0.0
    total_s: float = 0.0


@dataclass(slots=True)
class ReplayOutcome:
    """The action's result: answers in question order and seconds per phase (monotonic clock of rank 0)."""

    success: bool
    message: str
    answers: list[ReplayAnswer]
    frames: int = 0
    world_size: int = 1
    encode_s: float = 0.0
    prefill_s: float = 0.0
    decode_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Progress:
    """Feedback of a running job, from rank 0."""

    phase: str  # encoding, prefill, decoding
    frames_encoded: int
    frames_total: int
    questions_done: int
    questions_total: int
    prefill_progress: float  # share of the current question's decoder layers done
    eta_s: float  # seconds to the result; -1 while unknown


# Rank 0's way to run a job on every rank (spava/server.py's Dispatcher): (job, progress, cancelled) -> outcome.
RunJob = Callable[[ReplayJob, Callable[[Progress], None], Callable[[], bool]], ReplayOutcome]
# What hosts the service on rank 0 (programs/long_replay.py's serve): (run_job, world, max_frames, action name);
# returns when the host stops (shutdown, or the job group broke).
ServeJobs = Callable[[RunJob, int, int, str], None]
