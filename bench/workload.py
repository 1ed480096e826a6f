"""What every benchmark feeds the engine: a synthetic camera stream and two questions.

The stream is ``videokv_node.synthetic.SyntheticScene`` (320x240, 2 fps, seeded
background): frame i is the same bytes on every machine. Frames are drawn
before the clock starts, so scene rendering is never part of a measured ingest.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

from videokv_node.memory import Frame, Question, VideoMemoryEngine
from videokv_node.synthetic import SyntheticScene, default_scenario

from bench.timing import CallTimer, Summary

CAMERA = "/camera/front"
OPEN_MAX_NEW_TOKENS = 16


def mc_question() -> Question:
    return Question(
        "Which colour was the ball that crossed the room?", options=["red", "green", "blue", "yellow"]
    )


def open_question() -> Question:
    return Question("What did the camera see?", max_new_tokens=OPEN_MAX_NEW_TOKENS)


def stream(n_frames: int, seed: int) -> Iterator[Frame]:
    """The first ``n_frames`` frames of the default scenario (stretched to at least 20 frames)."""
    scene = SyntheticScene(seed=seed, scenario=default_scenario(max(n_frames, 20)))
    for stamp_ns, rgb, _ in scene.frames(n_frames):
        yield Frame(CAMERA, stamp_ns, rgb)


@dataclass(frozen=True, slots=True)
class IngestSamples:
    """Per-frame durations of one ingest run, in ingest order (warm-up included; callers slice)."""

    total_s: list[float]  # engine.ingest([frame]) wall time
    vision_s: list[float]  # the adapter's encode_frames inside it (preprocessing + vision tower + projector)

    @property
    def decoder_s(self) -> list[float]:
        """Everything else in ingest: decoder pass over the window, block bookkeeping, demotion."""
        return [t - v for t, v in zip(self.total_s, self.vision_s)]


def ingest_stream(engine: VideoMemoryEngine, frames: Iterator[Frame], on_frame=None) -> IngestSamples:
    """Ingest frames one at a time (as the node does), timing each; ``on_frame(i)`` after each."""
    total, vision = [], []
    with CallTimer(engine.adapter, "encode_frames") as vision_timer:
        for i, frame in enumerate(frames):
            t0 = time.perf_counter()
            engine.ingest([frame])
            total.append(time.perf_counter() - t0)
            vision.append(vision_timer.last_s)
            if on_frame is not None:
                on_frame(i)
    return IngestSamples(total, vision)


@dataclass(frozen=True, slots=True)
class QuestionTiming:
    ttft: Summary  # question start -> first token (option scores for multiple choice)
    total: Summary  # question start -> answer complete
    tokens_out: int  # tokens generated (1 for multiple choice); a random model may stop early at end-of-turn
    context_tokens: int  # memory tokens each layer attended to, sink included
    question_tokens: int  # prompt tokens after the memory: question, options, assistant turn opening


def time_question(engine: VideoMemoryEngine, question: Question, warmup: int, repeats: int) -> QuestionTiming:
    """Ask the same question ``warmup + repeats`` times on unchanged memory; summarise the last ``repeats``."""
    ttft, total, tokens = [], [], []
    answer = None
    for _ in range(warmup + repeats):
        counter = _TokenCounter()
        answer = engine.ask(question, on_token=counter)
        ttft.append(answer.ttft_s)
        total.append(answer.total_s)
        tokens.append(counter.n)
    n_question = len(engine.adapter.question_ids(question.text, question.options))
    return QuestionTiming(
        Summary.of(ttft[warmup:]), Summary.of(total[warmup:]), tokens[-1], answer.n_context_tokens, n_question
    )


class _TokenCounter:
    """An ``on_token`` callback that counts calls: the engine calls it once per generated token."""

    def __init__(self) -> None:
        self.n = 0

    def __call__(self, _text_so_far: str) -> None:
        self.n += 1
