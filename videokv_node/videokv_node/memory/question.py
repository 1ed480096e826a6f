"""What goes in and out of the engine: frames, questions, answers, and refusals.

``Frame`` lives on the ground floor (``videokv_node/frame.py``: model adapters take it too) and is
re-exported here with the engine's request and answer types.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from videokv_node.frame import Frame
from videokv_node.pose import Pose

__all__ = ["Answer", "Continuations", "Evidence", "Frame", "Question", "RequestError"]


class RequestError(ValueError):
    """A question the engine refuses; the message is returned to the caller verbatim."""


@dataclass(slots=True)
class Question:
    text: str
    options: list[str] = field(default_factory=list)  # empty: open question
    cameras: list[str] = field(default_factory=list)  # empty: all cameras
    since_ns: int = 0  # 0: from the oldest memory
    until_ns: int = 0  # 0: up to now
    max_new_tokens: int = 0  # 0: the engine's default


@dataclass(slots=True)
class Evidence:
    stamp_ns: int
    camera: str
    pose: Pose | None = None  # the robot's pose when the frame was taken, if the frame came with one
    # The last frame it stands for: a still span's end where later frames were merged into it
    # (memory.redundancy, issue 36), else 0 and read as ``stamp_ns`` (``last``).
    last_stamp_ns: int = 0
    last_pose: Pose | None = None  # the robot's pose at last_stamp_ns, if known (``pose`` when no span)

    @property
    def last(self) -> int:
        """The last frame's stamp: the span's end, or the frame itself."""
        return self.last_stamp_ns or self.stamp_ns


@dataclass(slots=True)
class Answer:
    text: str
    option_index: int  # -1 for an open question
    option_scores: list[float]  # probability per option, sums to 1; empty for an open question
    evidence: list[Evidence]  # frames whose KV the answer attended to, oldest first
    ttft_s: float  # question start -> first token (or option scores)
    total_s: float
    n_context_tokens: int  # tokens the question attended to in its largest layer, sink included (layers may differ)


@dataclass(slots=True)
class Continuations:
    """``VideoMemoryEngine.score_continuations``: how likely each continuation is as the answer."""

    logprobs: list[float]  # per continuation, the sum of its tokens' log-probabilities (natural log)
    evidence: list[Evidence]  # frames whose KV the scoring attended to, oldest first
    ttft_s: float  # question start -> context assembled and question prefilled
    total_s: float  # question start -> every continuation scored
    n_context_tokens: int  # as Answer.n_context_tokens
    n_tokens: list[int] = field(default_factory=list)  # per continuation, its number of tokens
