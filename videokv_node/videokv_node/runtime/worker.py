"""The model worker: the only thread that touches the model.

Subscription callbacks must never run inference (frames would pile up in DDS
and be dropped silently), so frames go into a bounded queue and one worker
thread feeds them to the engine. Questions and resets go into a separate queue
that the worker always serves first: a question waits at most for the frame
being encoded, never for the frame queue behind it, nor for the rest of a batch
(read-only requests are served between two prefill passes of a batch).
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from videokv_node.memory.engine import VideoMemoryEngine
from videokv_node.memory.question import Frame, Question
from videokv_node.memory.frames.vision_stage import PreparedFrames, vision_thread as new_vision_thread
from videokv_node.pose import Pose
from videokv_node.runtime.heap_trim import HeapTrim


class WorkerBusy(RuntimeError):
    """Too many questions are already waiting; the caller should retry later."""


class WorkerStopped(RuntimeError):
    """The worker was stopped (node shutting down) before the job ran."""


@dataclass(slots=True)
class _Job:
    run: Callable[[], Any]
    future: Future
    read_only: bool = False  # changes no memory (a question, a locate): may run between two frames of a batch
    counted: bool = True  # takes a slot of max_pending_jobs; False: a view's read (``peek``), bounded by MAX_PEEKS


# Views' reads (``peek``) waiting at once, besides the requests: the memory view's timer has one at a time.
MAX_PEEKS = 2


class ModelWorker:
    """Owns an engine and serialises every use of it.

    Frames waiting when the worker turns to them go to the engine together, at most
    ``max_batch`` at a time, so the vision encoder runs one batch instead of one call per
    frame; a read-only request (``ask``, ``call(..., read_only=True)``) waiting at the head of
    the queue runs between two prefill passes of the batch (``engine.ingest``'s ``between``: a pass
    is one frame, or up to ``memory.prefill_batch`` where the policy batches), so it waits for the
    vision batch and one pass at most, not for the whole batch.
    Requests still run in the order they were queued: a reset or write waiting ahead of a
    question holds it until the batch is done.

    With ``vision_thread`` the vision encoder runs on a thread of its own (``memory/frames/vision_stage.py``):
    the worker prepares the frames it takes (poses, still frames merged, their vision submitted),
    then runs the decoder over the batch it prepared before, so one batch's vision encoder and the
    previous batch's decoder overlap while frames keep coming; a batch with none before it waits for
    its own vision, as without. Every vision call is made on that thread, and a write request waits
    for the batch prepared before it to be ingested.

    A frame submitted without a pose gets it from ``pose_lookup(frame)`` when the worker
    takes it for ingest, not when it was submitted: odometry that arrived while the frame
    waited in the queue (it usually lags a camera's frame on a busy node) still counts. The
    lookup runs once per such frame, on the worker thread, just before ``engine.ingest``; a
    frame dropped from a full queue or by ``reset`` is never looked up. The pose the lookup
    returns is the one the engine stores with the frame's block.

    After each ingest batch and each request the worker gives the C heap's free pages back once
    RSS grew by more than ``heap_trim_bytes`` (``runtime/heap_trim.py``; 0: never), after a
    request's result is delivered and only when no request waits: the node's RSS stays flat
    under load.

    Invariants: the frame queue never holds more than ``queue_size`` frames
    (the oldest is dropped and counted when a new one arrives); at most
    ``max_pending_jobs`` questions/resets/calls wait, and besides them at most ``MAX_PEEKS`` reads of a view
    (``peek``: never counted against the planners' slots); after ``stop()`` returns the
    thread has exited and every pending future is failed with WorkerStopped.
    """

    def __init__(
        self,
        engine: VideoMemoryEngine,
        queue_size: int = 8,
        max_pending_jobs: int = 4,
        on_ingest_error: Callable[[Exception], None] | None = None,
        max_batch: int = 1,
        pose_lookup: Callable[[Frame], Pose | None] | None = None,
        heap_trim_bytes: int = 16 << 20,
        vision_thread: bool = False,
    ) -> None:
        if queue_size <= 0 or max_pending_jobs <= 0 or max_batch <= 0:
            raise ValueError("queue_size, max_pending_jobs and max_batch must be > 0")
        self.engine = engine
        self.queue_size = queue_size
        self.max_pending_jobs = max_pending_jobs
        self.max_batch = max_batch  # queued frames handed to one engine.ingest (one vision batch)
        self._frames: deque[Frame] = deque()
        self._jobs: deque[_Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._on_ingest_error = on_ingest_error
        # a frame -> the robot's pose at its stamp, or None (the lookup counts it); must not raise. Set at construction only.
        self._pose_lookup = pose_lookup
        self.frames_overflowed = 0  # dropped from a full queue; written under _cond
        self.frames_failed = 0  # raised inside the engine; written by the worker thread only
        # camera -> {"ingested", "overflowed", "failed"} -> frames; written under _cond, read by camera_counts()
        self._per_camera: dict[str, Counter] = {}
        self.heap = HeapTrim(heap_trim_bytes)  # used by the worker thread only
        self._vision = new_vision_thread() if vision_thread else None  # where the vision encoder runs; None: here
        self._thread = threading.Thread(target=self._run, name="videokv-model-worker", daemon=True)
        self._thread.start()

    # --- producers (any thread) -------------------------------------------
    def submit_frame(self, frame: Frame) -> bool:
        """Queue a frame; returns False if an older frame had to be dropped to make room.

        A frame with ``pose`` None gets its pose from ``pose_lookup`` at ingest (class docstring).
        """
        with self._cond:
            if self._stopping:
                raise WorkerStopped("worker stopped")
            dropped = len(self._frames) >= self.queue_size
            if dropped:
                oldest = self._frames.popleft()
                self.frames_overflowed += 1
                self._per_camera.setdefault(oldest.camera, Counter())["overflowed"] += 1
            self._frames.append(frame)
            self._cond.notify()
        return not dropped

    def ask(self, question: Question, on_token: Callable[[str], None] | None = None) -> Future:
        """Queue a question ahead of all frames; the future resolves to an Answer or raises RequestError.

        Whatever ``on_token`` raises (a caller's cancellation) ends the question and reaches the
        future; ``engine.ask`` changes no memory, so stopping it mid-generation is safe.
        """
        return self._submit(lambda: self.engine.ask(question, on_token=on_token), read_only=True)

    def reset(self) -> Future:
        """Drop queued frames and forget the memory, in order with questions."""

        def _reset() -> None:
            with self._cond:
                self._frames.clear()
            self.engine.reset()

        return self._submit(_reset)

    def call(self, run: Callable[[], Any], read_only: bool = False) -> Future:
        """Run ``run()`` on the worker thread, in order with questions (snapshots of the engine); ``read_only``:
        it changes no memory (``engine.locate``), so it may run between two frames of a batch."""
        return self._submit(run, read_only)

    def peek(self, run: Callable[[], Any]) -> Future:
        """Run a quick read-only ``run()`` (the memory view's ``read_view``) between two frames, like a read-only
        ``call``, but without taking one of the ``max_pending_jobs`` slots planners' questions wait in: at most
        ``MAX_PEEKS`` wait besides them (WorkerBusy past that), so a view never refuses a question."""
        return self._submit(run, read_only=True, counted=False)

    def _submit(self, run: Callable[[], Any], read_only: bool = False, counted: bool = True) -> Future:
        future: Future = Future()
        with self._cond:
            if self._stopping:
                raise WorkerStopped("worker stopped")
            waiting = sum(j.counted == counted for j in self._jobs)  # a few jobs at most
            if counted and waiting >= self.max_pending_jobs:
                raise WorkerBusy(f"{waiting} requests already waiting (max_pending_questions)")
            if not counted and waiting >= MAX_PEEKS:
                raise WorkerBusy(f"{waiting} reads of the memory's view already waiting")
            self._jobs.append(_Job(run, future, read_only, counted))
            self._cond.notify()
        return future

    def camera_counts(self) -> dict[str, dict[str, int]]:
        """A snapshot, per camera, of its frames ``ingested``, ``overflowed`` (dropped oldest from the full
        queue: the dropped frame's camera, not the newcomer's) and ``failed`` (raised inside the engine)."""
        with self._cond:
            return {camera: dict(c) for camera, c in self._per_camera.items()}

    def _count(self, frames: list[Frame], key: str) -> None:
        with self._cond:
            for f in frames:
                self._per_camera.setdefault(f.camera, Counter())[key] += 1

    @property
    def queue_depth(self) -> int:
        return len(self._frames)

    @property
    def pending_jobs(self) -> int:
        """Questions/resets/calls queued and not yet started, views' reads (``peek``) not counted (a snapshot: it
        may change at once)."""
        with self._cond:
            return sum(j.counted for j in self._jobs)

    @property
    def busy(self) -> bool:
        """True while a new question would be refused with WorkerBusy (read-only hint for admission)."""
        return self.pending_jobs >= self.max_pending_jobs

    # --- the worker thread ------------------------------------------------
    def _run(self) -> None:
        pending: tuple[list[Frame], PreparedFrames] | None = None  # prepared, its vision on the vision thread
        while True:
            with self._cond:
                while not (self._jobs or self._frames or self._stopping or pending):
                    self._cond.wait()
                if self._stopping:
                    return
                # A read-only request runs at once; a write (reset, load) after the batch prepared before it.
                job = self._jobs.popleft() if self._jobs and (pending is None or self._jobs[0].read_only) else None
                take = 0 if job or self._jobs else min(self.max_batch, len(self._frames))
                frames = [self._frames.popleft() for _ in range(take)]
            if job is not None:
                self._run_job(job)
                self._trim_heap()
                continue
            prepared = self._prepare(frames) if frames else None
            if self._vision is None:  # prepared (vision run) and ingested at once
                if prepared is not None:
                    self._ingest(*prepared)
            else:  # the decoder over the batch before, while these frames' vision runs on the vision thread
                if pending is not None:
                    self._ingest(*pending)
                pending = prepared
            self._trim_heap()

    def _prepare(self, frames: list[Frame]) -> tuple[list[Frame], PreparedFrames] | None:
        """Poses resolved, still frames merged, vision started; None (frames counted failed) if that raised."""
        try:
            self._resolve_poses(frames)
            return frames, self.engine.prepare(frames, vision=None if self._vision is None else self._vision.submit)
        except Exception as exc:  # a bad batch must not stop the memory; its frames are counted as failed
            self._failed(frames, exc)
            return None

    def _ingest(self, frames: list[Frame], prepared: PreparedFrames) -> None:
        """The decoder over a prepared batch (up to max_batch frames), waiting questions between its passes."""
        try:
            self.engine.ingest_prepared(prepared, between=self._serve_read_only)
            self._count(frames, "ingested")
        except Exception as exc:
            self._failed(frames, exc)

    def _failed(self, frames: list[Frame], exc: Exception) -> None:
        self.frames_failed += len(frames)
        self._count(frames, "failed")
        if self._on_ingest_error:
            self._on_ingest_error(exc)

    def _trim_heap(self) -> None:
        """Trim the C heap if RSS grew past the bound, unless a request waits: it never waits for a trim."""
        if not self._jobs:  # a hint read without the lock: a request arriving now waits one trim at most
            self.heap.maybe_trim()

    @staticmethod
    def _run_job(job: _Job) -> None:
        if job.future.set_running_or_notify_cancel():
            try:
                job.future.set_result(job.run())
            except BaseException as exc:  # delivered to the caller, never kills the worker
                job.future.set_exception(exc)

    def _serve_read_only(self) -> None:
        """Between two frames of a batch: run the read-only requests at the head of the queue, in order."""
        while True:
            with self._cond:
                if self._stopping or not self._jobs or not self._jobs[0].read_only:
                    return
                job = self._jobs.popleft()
            self._run_job(job)
            self._trim_heap()

    def _resolve_poses(self, frames: list[Frame]) -> None:
        """Give each frame without a pose the pose at its stamp, as late as possible: right before ingest.

        A lookup that raises breaks its contract; the batch then fails like an engine error (counted, reported).
        """
        if self._pose_lookup is None:
            return
        for f in frames:
            if f.pose is None:
                f.pose = self._pose_lookup(f)

    def stop(self, timeout: float | None = 30.0) -> None:
        """Stop after the current job; fail what is still queued."""
        with self._cond:
            self._stopping = True
            pending, self._jobs = list(self._jobs), deque()
            self._frames.clear()
            self._cond.notify_all()
        for job in pending:
            job.future.set_exception(WorkerStopped("node shutting down"))
        self._thread.join(timeout)
        if self._vision is not None:
            self._vision.shutdown(wait=False, cancel_futures=True)  # a vision call running ends on its own

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()
