"""The model worker's scheduling: questions before queued frames, bounded queues, clean stop."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from videokv_node.memory.question import Frame, Question, RequestError
from videokv_node.pose import Pose, yaw_quaternion
from tests.unit.staged_engine import StagedIngest
from videokv_node.runtime.worker import MAX_PEEKS, ModelWorker, WorkerBusy, WorkerStopped


class RecordingEngine(StagedIngest):
    """Records the order of calls; ``gate`` holds the first ingest until the test releases it."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.gate = threading.Event()
        self.started = threading.Event()

    def ingest(self, frames, between=None):
        self.started.set()
        self.gate.wait(10)
        for f in frames:
            if f.camera == "bad":
                raise ValueError("broken frame")
            self.calls.append(f"frame {f.stamp_ns}")

    def ask(self, question, on_token=None):
        if not question.text:
            raise RequestError("question is empty")
        self.calls.append(f"ask {question.text}")
        return question.text.upper()

    def reset(self):
        self.calls.append("reset")


def frame(stamp: int, camera: str = "cam") -> Frame:
    return Frame(camera, stamp, np.zeros((2, 2, 3), np.uint8))


def test_question_waits_only_for_the_frame_being_ingested():
    engine = RecordingEngine()
    worker = ModelWorker(engine, queue_size=10)
    try:
        for stamp in range(5):
            worker.submit_frame(frame(stamp))
        assert engine.started.wait(5)  # frame 0 is being ingested, 1..4 wait in the queue
        answer = worker.ask(Question("where"))
        engine.gate.set()
        assert answer.result(5) == "WHERE"
        worker.reset().result(5)
        assert engine.calls[:2] == ["frame 0", "ask where"]
    finally:
        worker.stop()


class BatchEngine(RecordingEngine):
    """Calls ``between`` between frames as VideoMemoryEngine.ingest does; holds the batch's first frame
    on ``gate`` once ``hold`` is set (so a test can queue requests while a batch is being ingested)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = threading.Event()

    def ingest(self, frames, between=None):
        for i, f in enumerate(frames):
            if i and between is not None:
                between()
            if i == 0 and self.hold.is_set():
                self.started.set()
                self.gate.wait(10)
            self.calls.append(f"frame {f.stamp_ns}")


@pytest.mark.parametrize(("ahead", "order"), [
    (False, ["frame 1", "ask where", "frame 2", "frame 3"]),  # served between two frames of the batch
    (True, ["frame 1", "frame 2", "frame 3", "reset", "ask where"]),  # a reset ahead of it holds it: order kept
])
def test_a_waiting_question_is_served_between_two_frames_of_a_batch(ahead, order):
    engine = BatchEngine()
    worker = ModelWorker(engine, queue_size=10, max_batch=3)
    try:
        gate0 = threading.Event()
        worker.call(lambda: gate0.wait(10))  # the worker waits here while the batch is queued
        for stamp in (1, 2, 3):
            worker.submit_frame(frame(stamp))
        engine.hold.set()
        gate0.set()
        assert engine.started.wait(5)  # frame 1 of the batch [1, 2, 3] is being ingested
        if ahead:
            worker.reset()
        answer = worker.ask(Question("where"))
        engine.gate.set()
        assert answer.result(5) == "WHERE"
        worker.call(lambda: None).result(5)
        assert engine.calls == order
    finally:
        worker.stop()


def test_full_queue_drops_the_oldest_frame_and_counts_it():
    engine = RecordingEngine()
    worker = ModelWorker(engine, queue_size=2)
    try:
        worker.submit_frame(frame(0))
        assert engine.started.wait(5)
        results = [worker.submit_frame(frame(s)) for s in (1, 2, 3, 4)]
        assert results == [True, True, False, False] and worker.frames_overflowed == 2
        assert worker.queue_depth == 2
        engine.gate.set()
        worker.ask(Question("done")).result(5)
        worker.reset().result(5)  # after the question: frames 3 and 4 may or may not have run yet
        assert engine.calls[0] == "frame 0" and "frame 1" not in engine.calls and "frame 2" not in engine.calls
    finally:
        worker.stop()


def test_per_camera_counts_name_the_dropped_frames_camera_not_the_newcomers():
    engine = RecordingEngine()
    worker = ModelWorker(engine, queue_size=2, max_batch=1)
    try:
        worker.submit_frame(frame(0, "a"))
        assert engine.started.wait(5)  # frame 0 of a is being ingested
        for stamp, camera in ((1, "a"), (2, "b"), (3, "b"), (4, "bad")):  # 3 and 4 push out a@1 and b@2
            worker.submit_frame(frame(stamp, camera))
        engine.gate.set()
        worker.call(lambda: None).result(5)
        while worker.queue_depth:  # the two queued frames after the call
            worker.call(lambda: None).result(5)
        worker.stop()
        assert worker.camera_counts() == {"a": {"ingested": 1, "overflowed": 1}, "b": {"overflowed": 1, "ingested": 1},
                                          "bad": {"failed": 1}}
    finally:
        worker.stop()


def test_too_many_waiting_questions_are_refused_and_errors_reach_the_caller():
    engine = RecordingEngine()
    worker = ModelWorker(engine, queue_size=2, max_pending_jobs=2)
    try:
        worker.submit_frame(frame(0))
        assert engine.started.wait(5)
        assert worker.pending_jobs == 0 and not worker.busy
        first, second = worker.ask(Question("a")), worker.ask(Question(""))
        assert worker.pending_jobs == 2 and worker.busy  # what the ~/ask action's goal callback reads
        with pytest.raises(WorkerBusy):
            worker.ask(Question("c"))
        engine.gate.set()
        assert first.result(5) == "A"
        with pytest.raises(RequestError, match="empty"):
            second.result(5)
    finally:
        worker.stop()


def test_a_views_read_takes_no_planners_slot_and_is_bounded_on_its_own():
    """The memory view reads the memory about once a second (``peek``): while it waits, planners still get every
    one of ``max_pending_jobs``; reads past ``MAX_PEEKS`` are refused on their own; both run between frames, in order."""
    engine = RecordingEngine()
    worker = ModelWorker(engine, queue_size=4, max_pending_jobs=2, max_batch=1)
    try:
        worker.submit_frame(frame(0))
        assert engine.started.wait(5)  # frame 0 is being ingested: everything below waits
        worker.submit_frame(frame(1))
        reads = [worker.peek(lambda: engine.calls.append("view") or "read") for _ in range(MAX_PEEKS)]
        assert worker.pending_jobs == 0 and not worker.busy  # the ~/ask goal callback admits questions
        with pytest.raises(WorkerBusy, match="reads of the memory's view"):
            worker.peek(lambda: None)
        questions = [worker.ask(Question("a")), worker.ask(Question("b"))]
        assert worker.pending_jobs == 2 and worker.busy
        with pytest.raises(WorkerBusy, match="max_pending_questions"):
            worker.ask(Question("c"))
        engine.gate.set()
        assert [r.result(5) for r in reads] == ["read"] * MAX_PEEKS and [q.result(5) for q in questions] == ["A", "B"]
        assert engine.calls[:1 + MAX_PEEKS + 2] == ["frame 0"] + ["view"] * MAX_PEEKS + ["ask a", "ask b"]
        assert not worker.busy
        worker.peek(lambda: None).result(5)  # a slot of its own again once the others ran
    finally:
        worker.stop()


def test_a_failing_frame_is_counted_and_the_worker_goes_on():
    engine = RecordingEngine()
    engine.gate.set()
    errors = []
    worker = ModelWorker(engine, queue_size=4, on_ingest_error=errors.append, heap_trim_bytes=0)  # no trim between the frames
    try:
        worker.submit_frame(frame(0, camera="bad"))
        worker.submit_frame(frame(1))
        worker.ask(Question("ok")).result(5)
        worker.reset().result(5)
        assert worker.frames_failed == 1 and len(errors) == 1 and "frame 1" in engine.calls
        assert worker.alive
    finally:
        worker.stop()


def test_stop_fails_pending_requests_and_joins():
    engine = RecordingEngine()
    worker = ModelWorker(engine, queue_size=2)
    worker.submit_frame(frame(0))
    assert engine.started.wait(5)
    pending = worker.ask(Question("never"))
    stopper = threading.Thread(target=worker.stop)
    stopper.start()
    with pytest.raises(WorkerStopped):
        pending.result(5)
    engine.gate.set()
    stopper.join(10)
    assert not worker.alive
    with pytest.raises(WorkerStopped):
        worker.submit_frame(frame(1))


def test_a_frame_gets_the_pose_that_arrived_while_it_waited_in_the_queue():
    """The pose is looked up when the worker takes the frame, not when it was submitted: odometry that
    arrives after the image (before ingest) gives it the pose interpolated at its stamp."""
    from videokv_node.ingest.pose_history import PoseConfig, PoseHistory

    ns = 1_000_000_000
    history = PoseHistory(PoseConfig(pose_topic="odom", pose_tolerance_s=0.1))
    engine = RecordingEngine()
    ingested: list[Frame] = []
    engine.ingest = lambda frames, between=None: (engine.started.set(), engine.gate.wait(10), ingested.extend(frames))
    worker = ModelWorker(engine, queue_size=10, pose_lookup=lambda f: history.at(f.stamp_ns), heap_trim_bytes=0)  # no trim between the batches
    try:
        worker.submit_frame(frame(0))  # before any pose: ingested at once, none to be had
        assert engine.started.wait(5)
        given = Pose.make("map", (9.0, 9.0, 9.0), (0.0, 0.0, 0.0, 1.0))
        worker.submit_frame(Frame("cam", 2 * ns, np.zeros((2, 2, 3), np.uint8), given))  # came with a pose: kept
        worker.submit_frame(frame(ns + ns // 4))  # 1.25 s: waits in the queue
        worker.submit_frame(frame(3 * ns))  # 1 s past the newest pose once the poses are in
        history.add(ns, "odom", (0.0, 0.0, 0.0), yaw_quaternion(0.0))  # odometry arrives after the images
        history.add(2 * ns, "odom", (4.0, -2.0, 0.0), yaw_quaternion(1.0))
        engine.gate.set()
        worker.ask(Question("done")).result(5)
    finally:
        worker.stop()
    poses = {f.stamp_ns: f.pose for f in ingested}
    assert poses[0] is None and poses[2 * ns] is given and poses[3 * ns] is None
    got = poses[ns + ns // 4]
    assert got is not None and got.frame_id == "odom"
    assert got.position == pytest.approx((1.0, -0.5, 0.0), abs=1e-12)  # a quarter of the way
    assert got.orientation == pytest.approx(yaw_quaternion(0.25), abs=1e-12)  # slerp: a quarter of the turn
    assert (history.counters.frames_with_pose, history.counters.frames_without_pose) == (1, 2)  # `given` not looked up
