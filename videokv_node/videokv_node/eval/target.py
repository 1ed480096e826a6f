"""What an evaluation drives: a target that takes a stream's frames and answers questions about them.

Three targets implement ``EvalTarget``: ``replay.EngineTarget`` (the engine in-process, fed
from a bag), ``programs/replay_target.py``'s ``RosTarget`` (the node as a process, over DDS, fed
from a bag) and ``text_stream.TextTarget`` (the engine over a text LM, fed text frames).
The two bag targets are also ``BagTarget``s: ``replay.replay`` drives either the same way,
and both answer the same questions identically for the same bag and settings (tested).
``replay._ask`` writes a row from any target's ``Reply`` and ``MemoryState``.

The order contract every target keeps: once ``settle`` returns, every frame offered
before it is in memory, so a question asked next sees exactly those frames.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from videokv_node.eval.bag_io import BagImage, BagMessage
    from videokv_node.eval.questions import EvalQuestion
    from videokv_node.eval.results import ResultWriter

FrameT = TypeVar("FrameT", contravariant=True)


class AskRefused(RuntimeError):
    """The target refused a question (the engine's RequestError, the node's success=false); the reason is the message."""


@dataclass(slots=True)
class Reply:
    """A target's answer, in the same form for every target."""

    prediction: str
    option_index: int
    evidence_ns: list[int]
    ttft_s: float
    total_s: float
    method: str  # "likelihood", "letter" or "cloze" for multiple choice, "" for open questions
    layer_evidence_ns: list[list[int]] | None = None  # per layer, the frames it attended to; None where unseen (ROS)
    layer_token_share: list[dict[int, float]] | None = None  # per layer, {frame: share of its tokens attended}; None where unseen
    # per evidence stamp, the robot's (x, y, yaw) there or None (no pose); None where the target gives no poses (engine)
    evidence_poses: list[tuple[float, float, float] | None] | None = None


@dataclass(slots=True)
class MemoryState:
    """The target's memory when a question is asked (for the question's row)."""

    frames_in_memory: int
    tokens_resident: int
    bytes_resident: int
    bytes_offloaded: int
    encode_ms_total: float


@dataclass(slots=True)
class ReplayCounts:
    """What happened to the bag's messages (the same counts on both bag targets)."""

    messages: int = 0
    admitted: int = 0  # sampled into memory
    skipped: int = 0  # not sampled (too soon after the previous frame of the camera)
    dropped: int = 0  # undecodable or stale, as the node would drop them
    drop_reasons: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str) -> None:
        self.dropped += 1
        self.drop_reasons[reason] = self.drop_reasons.get(reason, 0) + 1


class EvalTarget(Protocol[FrameT]):
    """A memory under evaluation; ``FrameT`` is what one ``offer`` takes (a bag message, a text frame)."""

    via: str  # how the memory is reached ("engine", "ros"), for the progress bar and the run's config

    def offer(self, frame: FrameT) -> None:
        """Take the stream's next frame (it may be admitted, skipped or dropped, as the node would)."""

    def settle(self) -> None:
        """Return once every frame offered so far is in memory."""

    def ask(self, q: EvalQuestion) -> Reply:
        """Answer ``q`` from memory now; raises AskRefused with the reason for a refused question."""

    def memory(self) -> MemoryState:
        """The memory's figures now."""

    def close(self) -> None:
        """Release the memory (and the model, the node process)."""


class BagTarget(EvalTarget["BagImage"], Protocol):
    """A target fed from a rosbag2 (``replay.replay``): it counts the bag's messages and reports its own figures."""

    counts: ReplayCounts

    def relay(self, message: BagMessage) -> None:
        """Pass on a recorded non-image message (odometry, tf, camera_info), in its place in the stream."""

    def report(self, writer: ResultWriter, origin_ns: int) -> dict:
        """Write ingest times and memory samples to ``writer`` (stream time from ``origin_ns``); return summary extras."""
