"""Replay a bag's camera stream into a memory and ask the questions at their times, incrementally.

The stream is encoded once, frame by frame, as on the robot: a question asked at
``end_time`` sees every frame recorded up to that bag time and none after it, and
nothing is ever re-encoded for a question. Two targets (``eval/target.py``'s ``BagTarget``)
receive the same stream:

- ``EngineTarget`` (``--via engine``): the engine in-process, frames decoded and
  sampled exactly as the node does (the node's decoders, ``FrameSampler`` on header
  stamps, one ``ingest`` call per frame like the node's worker);
- ``RosTarget`` (``--via ros``, ``programs/replay_target.py``): the node as a process, the
  recorded messages republished over DDS.

Both answer the same questions identically for the same bag and settings (tested).
Order is exact, whatever the speed: before a question the replay waits until the
target has encoded every frame it admitted so far (``settle``).
"""

from __future__ import annotations

import time

from tqdm import tqdm

from videokv_node.eval.bag_io import BagError, BagImage, BagMessage, ImageBag
from videokv_node.eval.evidence_map import PoseTrack
from videokv_node.eval.questions import EvalQuestion, VideoQuestions
from videokv_node.eval.grounding import in_span, span_recall, spans_ns
from videokv_node.eval.recall import needle_recall, needle_token_share
from videokv_node.eval.results import QuestionResult, ResultWriter
from videokv_node.eval.settings import EngineSettings
from videokv_node.eval.target import AskRefused, BagTarget, EvalTarget, MemoryState, ReplayCounts, Reply
from videokv_node.ingest.image_decode import ImageDecodeError
from videokv_node.ingest.sampler import NS_PER_S, FrameSampler, SampleDecision
from videokv_node.memory.config import OPTION_SCORINGS
from videokv_node.memory.question import Frame, Question, RequestError

# A question this much after the bag's last message is still asked (float seconds in files).
END_SLACK_S = 1e-6


class Admission:
    """The node's front end without ROS: decode first, then sample by header stamp.

    A malformed frame is dropped before sampling and never takes a sample slot, an
    unstamped one (stamp 0) is stamped with its bag time (what the node does with
    ``use_sim_time`` during a replay), exactly as the node's ``CameraIntake.image_callback``.
    """

    def __init__(self, sampler: FrameSampler, counts: ReplayCounts) -> None:
        self.sampler, self.counts = sampler, counts

    def admit(self, image: BagImage) -> Frame | None:
        self.counts.messages += 1
        try:
            rgb = image.rgb()
        except ImageDecodeError as exc:
            self.counts.drop(exc.reason)
            return None
        stamp_ns = image.stamp_ns or image.bag_time_ns
        decision = self.sampler.offer(image.topic, stamp_ns)
        if decision is SampleDecision.STALE:
            self.counts.drop("stale")
            return None
        if not decision.admitted:
            self.counts.skipped += 1
            return None
        self.counts.admitted += 1
        return Frame(image.topic, stamp_ns, rgb)


class EngineTarget:
    """A ``BagTarget`` (eval/target.py): the engine in-process, fed like the node's model worker feeds it."""

    via = "engine"
    counts: ReplayCounts

    def __init__(self, settings: EngineSettings, option_scoring: str | None = None) -> None:
        from videokv_node.memory.engine import VideoMemoryEngine
        from videokv_node.models.factory import load_adapter
        from videokv_node.process_settings import apply_process_settings

        apply_process_settings(settings.torch_threads)  # one thread runs the engine here: Python's own switch interval
        adapter = load_adapter(settings.model, device=settings.device, dtype=settings.dtype, seed=settings.seed)
        self.engine = VideoMemoryEngine(adapter, settings.memory, settings.generation)
        self.counts = ReplayCounts()
        self.admission = Admission(FrameSampler(settings.sampler), self.counts)
        # None: the node's own way, the answer.option_scoring parameter (settings.generation).
        self.option_scoring = option_scoring or settings.generation.answer.option_scoring
        self._choose = _option_chooser(self.option_scoring)
        self.encode_ms: list[float] = []
        self.samples: list[tuple[int, int, int]] = []  # (stamp_ns, bytes_resident, bytes_offloaded) after each frame

    def offer(self, image: BagImage) -> None:
        frame = self.admission.admit(image)
        if frame is None:
            return
        t0 = time.perf_counter()
        try:
            self.engine.ingest([frame])
        except Exception as exc:  # noqa: BLE001 - the node's worker drops and counts such a frame; so does this
            self.counts.drop(f"model_error: {type(exc).__name__}")
            return
        self.encode_ms.append((time.perf_counter() - t0) * 1e3)
        s = self.engine.stats()
        self.samples.append((frame.stamp_ns, s.bytes_resident, s.bytes_offloaded))

    def settle(self) -> None:
        """Nothing to wait for: ``offer`` returns once the frame is encoded."""

    def relay(self, message: BagMessage) -> None:
        """Nothing: the engine's frames carry no poses (the node's do: ``--via ros`` passes odometry and tf on)."""

    def ask(self, q: EvalQuestion) -> Reply:
        question = Question(q.question, list(q.choices))
        try:
            if q.choices and self._choose is not None:
                return self._choose(self.engine, question, q)
            answer = self.engine.ask(question, option_scoring=self.option_scoring)
        except RequestError as exc:
            raise AskRefused(str(exc)) from exc
        return Reply(answer.text, answer.option_index, [e.stamp_ns for e in answer.evidence], answer.ttft_s,
                     answer.total_s, self.option_scoring if q.choices else "", self.engine.last_layer_stamps,
                     self.engine.last_layer_token_share)

    def memory(self) -> MemoryState:
        s = self.engine.stats()
        return MemoryState(s.frames_in_memory, s.tokens_resident, s.bytes_resident, s.bytes_offloaded, sum(self.encode_ms))

    def report(self, writer: ResultWriter, origin_ns: int) -> dict:
        for ms in self.encode_ms:
            writer.add_ingest_ms(ms)
        for stamp, res, off in self.samples:
            writer.add_memory_sample((stamp - origin_ns) / NS_PER_S, res, off)
        return {"ingest_ms_source": "measured per frame around engine.ingest (vision tower, prefill, policy)"}

    def close(self) -> None:
        self.engine.close()


def _option_chooser(method: str):
    """None for the engine's own scorings (letter, likelihood: as the node answers); else eval/option_scoring.choose_option."""
    if method in OPTION_SCORINGS:
        return None
    try:
        from videokv_node.eval.option_scoring import choose_option
    except ImportError as exc:
        raise RuntimeError(f"--option-scoring {method} needs videokv_node/eval/option_scoring.py: {exc}") from exc

    def choose(engine, question: Question, q: EvalQuestion) -> Reply:
        c = choose_option(engine, question, list(q.choices), method)
        return Reply(q.choices[c.index], c.index, list(c.evidence_stamps_ns), c.ttft_s, c.total_s, c.method,
                     engine.last_layer_stamps, engine.last_layer_token_share)

    return choose


class Pacer:
    """Keeps the replay at ``rate`` x real time (0: as fast as possible), resuming after pauses.

    Waiting for the target (encoding, answering) pauses the stream's clock: after
    ``resume`` the schedule continues from there, it never bursts to catch up.
    """

    def __init__(self, rate: float) -> None:
        if rate < 0:
            raise ValueError(f"rate must be >= 0 (0: as fast as possible), got {rate}")
        self.rate = rate
        self._wall = time.monotonic()
        self._stream = 0.0

    def wait_until(self, stream_s: float) -> None:
        if self.rate <= 0:
            return
        delay = self._wall + (stream_s - self._stream) / self.rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def resume(self, stream_s: float) -> None:
        self._wall, self._stream = time.monotonic(), stream_s


def _ask(target: EvalTarget, video_id: str, q: EvalQuestion, writer: ResultWriter, origin_ns: int = 0) -> None:
    """Ask ``q`` and write its row; ``origin_ns`` is the stamp of stream time 0 (the needle stamps' origin)."""
    target.settle()  # every frame admitted before the question is in memory
    state = target.memory()
    try:
        reply = target.ask(q)
    except AskRefused as exc:
        writer.skip(video_id, q.question, f"refused: {exc}", q.end_time)
        return
    expected = q.answer_index()
    if q.choices:
        correct = reply.option_index == expected
    else:
        correct = _normalise(reply.prediction) == _normalise(q.answer)
    needles = [origin_ns + round(s * NS_PER_S) for s in q.evidence_stamps]
    recall, recall_layers = needle_recall(needles, reply.evidence_ns, reply.layer_evidence_ns)
    token_share = needle_token_share(needles, reply.layer_token_share)
    spans = spans_ns(q.time_spans, q.evidence_stamps, origin_ns)
    writer.add(QuestionResult(
        video_id=video_id, question=q.question, answer=q.answer, prediction=reply.prediction,
        option_index=reply.option_index, correct=correct, ttft_s=reply.ttft_s, total_s=reply.total_s,
        encode_ms_total=state.encode_ms_total, frames_in_memory=state.frames_in_memory,
        tokens_resident=state.tokens_resident, bytes_resident=state.bytes_resident,
        bytes_offloaded=state.bytes_offloaded, evidence_stamps=list(reply.evidence_ns),
        question_type=q.question_type, stream_time_s=q.end_time, method=reply.method,
        needle_recall=recall, needle_recall_layers=recall_layers, needle_token_share=token_share,
        span_recall=span_recall(reply.evidence_ns, spans), in_span=in_span(reply.evidence_ns, spans),
        evidence_poses=reply.evidence_poses, truth_stamps=needles, truth_spans=spans,
    ))


def _normalise(text: str) -> str:
    """Open answers are judged by exact match after case and punctuation folding (ReKV's open-ended
    benchmarks use an LLM judge instead; none is available offline)."""
    return " ".join("".join(ch for ch in text.casefold() if ch.isalnum() or ch.isspace()).split())


def replay(bag: ImageBag, video: VideoQuestions, target: BagTarget, writer: ResultWriter, rate: float = 0.0,
           progress: bool = True) -> dict:
    """Stream ``bag`` into ``target``, asking ``video``'s questions at their end_time; rows go to ``writer``.

    Time 0 of the question file is the bag's start. A question exactly at a frame's bag
    time sees that frame. A question asked after the bag's last frame (ReKV's and
    StreamingBench's files ask at the end of a video) is answered from the whole bag; a
    question before the first image, refused questions and the questions left when the bag
    turns out unreadable part-way are skipped with the reason (skipped.jsonl); rows already
    written stay. Returns what happened, for the summary.
    """
    origin = bag.start_ns
    end_s = (bag.end_ns - 1 - origin) / NS_PER_S  # rosbags' end_time is one past the last message
    pending = list(video.questions)
    pacer = Pacer(rate)
    error = None
    first_s = None  # bag time of the first image
    bar = tqdm(total=bag.message_count(relayed=True), unit="msg", desc=f"{video.video_id} via {target.via}", disable=not progress)
    writer.track = PoseTrack()  # this bag's odometry: the report's maps of evidence against truth
    try:
        for image in bag.messages():
            if isinstance(image, BagMessage):  # odometry, tf, camera_info: passed on in its place, asked nothing
                writer.track.add(image)
                target.relay(image)
                bar.update(1)
                continue
            t = (image.bag_time_ns - origin) / NS_PER_S
            while pending and pending[0].end_time < t:
                q = pending.pop(0)
                if first_s is None:
                    writer.skip(video.video_id, q.question, f"asked at {q.end_time:.3f} s, before the bag's first image "
                                f"({t:.3f} s): nothing to answer from", q.end_time)
                    continue
                pacer.wait_until(q.end_time)
                _ask(target, video.video_id, q, writer, origin)
                pacer.resume(q.end_time)
            first_s = t if first_s is None else first_s
            pacer.wait_until(t)
            target.offer(image)
            bar.update(1)
    except BagError as exc:
        error = str(exc)
        for q in pending:
            writer.skip(video.video_id, q.question, f"not asked: {exc}", q.end_time)
        pending = []
    finally:
        bar.close()
    for q in pending:  # at or after the last image: the whole bag is in memory (nothing is waited for past its end)
        if first_s is None:
            writer.skip(video.video_id, q.question, "the bag has no image: nothing to answer from", q.end_time)
            continue
        pacer.wait_until(min(q.end_time, end_s))
        _ask(target, video.video_id, q, writer, origin)
        pacer.resume(min(q.end_time, end_s))
    counts = target.counts
    return {
        "bag": {"path": str(bag.path), "name": bag.name, "topics": bag.topics, "relayed_topics": sorted(bag.relay),
                "duration_s": end_s,
                "messages": counts.messages, "frames_admitted": counts.admitted, "frames_skipped": counts.skipped,
                "frames_dropped": counts.dropped, "drop_reasons": counts.drop_reasons},
        "bag_error": error,
        **target.report(writer, origin),
    }
