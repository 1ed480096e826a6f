"""The vision encoder on a thread of its own (issue 33, ``memory/frames/vision_stage.py``, ``runtime/worker.py``).

The engine's two stages make exactly the memory that ``ingest`` makes, also when the next batch is
prepared before the previous one is decoded; the worker's vision calls all run on the vision thread,
one batch's vision overlaps the previous batch's decoder, a write request waits for the batch
prepared before it, and a vision error costs its own frames only.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from tests.unit.staged_engine import StagedIngest
from tests.unit.test_still_frames import engine as still_engine
from tests.unit.test_still_frames import frame_blocks, stream
from videokv_node.memory.question import Frame, Question
from videokv_node.memory.frames.vision_stage import PreparedFrames, run_now, vision_thread
from videokv_node.runtime.worker import ModelWorker

KINDS = "aaabbbtaaabbaa"  # still stretches, a view change, a thing seen once, revisits


def held(e) -> list[tuple[int, tuple[int, ...], torch.Tensor]]:
    """Every held block's id, stamps and keys (the layers it keeps), in id order: what the memory holds."""
    return [(b.block_id, tuple(b.stamps_ns),
             torch.cat([e.store.layer_kv(b, i)[0].flatten() for i, kv in enumerate(b.layers) if kv is not None]).float())
            for b in sorted(e.store.blocks(), key=lambda b: b.block_id)]


@pytest.mark.parametrize("policy", ["rekv", "streamkv"])
def test_prepared_ahead_the_memory_is_what_ingest_makes(tiny_adapter, policy):
    frames, batch = stream(KINDS), 3
    plain = still_engine(tiny_adapter, policy)
    for i in range(0, len(frames), batch):
        plain.ingest(frames[i:i + batch])

    staged = still_engine(tiny_adapter, policy)
    vision = vision_thread()
    try:
        pending = None
        for i in range(0, len(frames), batch):  # the worker's order: prepare the next, then decode the one before
            prepared = staged.prepare(frames[i:i + batch], vision=vision.submit)
            if pending is not None:
                staged.ingest_prepared(pending)
            pending = prepared
        staged.ingest_prepared(pending)
    finally:
        vision.shutdown()

    assert frame_blocks(staged) == frame_blocks(plain)
    a, b = held(plain), held(staged)
    assert [x[:2] for x in a] == [x[:2] for x in b]
    for (_, _, ka), (_, _, kb) in zip(a, b):
        torch.testing.assert_close(ka, kb, rtol=0, atol=0)
    assert staged.stats().frames_ingested == plain.stats().frames_ingested == len(frames)
    assert staged.stats().frames_merged == plain.stats().frames_merged > 0


def test_the_workers_vision_calls_all_run_on_the_vision_thread(tiny_adapter, monkeypatch):
    e = still_engine(tiny_adapter, "rekv")
    threads: list[str] = []
    encode = tiny_adapter.encode_frames

    def recording(rgbs):
        threads.append(threading.current_thread().name)
        return encode(rgbs)

    monkeypatch.setattr(tiny_adapter, "encode_frames", recording)  # this test's spy, removed after it
    frames = stream("abtababta")
    worker = ModelWorker(e, queue_size=16, max_batch=2, vision_thread=True)
    try:
        for f in frames:
            worker.submit_frame(f)
        assert wait_for(lambda: worker.camera_counts().get("cam", {}).get("ingested", 0) == len(frames))
        assert worker.ask(Question("What did you see?")).result(60) is not None
    finally:
        worker.stop()
    assert threads and set(threads) == {"videokv-vision_0"}
    assert e.stats().frames_ingested == len(frames)


def wait_for(condition, timeout: float = 30.0) -> bool:
    done = threading.Event()
    for _ in range(int(timeout / 0.02)):
        if condition():
            return True
        done.wait(0.02)
    return condition()


class OverlapEngine(StagedIngest):
    """Its vision and decoder record when they run; the decoder of the first frame waits (up to 5 s) for the
    vision of the second to start, which happens only if they overlap."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.second_vision = threading.Event()
        self.overlapped = None
        self.gate = threading.Event()  # cleared: holds the first frame's decoder (the write-order test)
        self.gate.set()
        self.first_decoding = threading.Event()

    def prepare(self, frames, vision=None):
        stamps = [f.stamp_ns for f in frames]

        def work():
            if any(f.camera == "bad" for f in frames):
                raise ValueError("broken frame")
            if 2 in stamps:
                self.second_vision.set()
            return None, 0.0

        return PreparedFrames(list(frames), (vision or run_now)(work))

    def ingest(self, frames, between=None):
        if frames[0].stamp_ns == 1:
            self.first_decoding.set()
            self.overlapped = self.second_vision.wait(5)
            self.gate.wait(10)
        self.calls.extend(f"frame {f.stamp_ns}" for f in frames)

    def ask(self, question, on_token=None):
        return question.text

    def reset(self):
        self.calls.append("reset")


def frame(stamp: int, camera: str = "cam") -> Frame:
    return Frame(camera, stamp, np.zeros((2, 2, 3), np.uint8))


def queued_then_released(worker: ModelWorker, frames: list[Frame]) -> None:
    """Queue ``frames`` while the worker is held by a request, then let it go: it finds them all queued."""
    hold = threading.Event()
    held_job = worker.call(hold.wait, read_only=True)
    for f in frames:
        worker.submit_frame(f)
    hold.set()
    held_job.result(10)


@pytest.mark.parametrize("own_thread", [True, False])
def test_the_next_batchs_vision_overlaps_the_decoder_only_with_the_vision_thread(own_thread):
    e = OverlapEngine()
    worker = ModelWorker(e, queue_size=8, max_batch=1, vision_thread=own_thread)
    try:
        queued_then_released(worker, [frame(1), frame(2), frame(3)])
        assert wait_for(lambda: len(e.calls) == 3)
    finally:
        worker.stop()
    assert e.overlapped is own_thread
    assert e.calls == ["frame 1", "frame 2", "frame 3"]


def test_a_write_request_waits_for_the_batch_prepared_before_it():
    e = OverlapEngine()
    e.gate.clear()
    worker = ModelWorker(e, queue_size=8, max_batch=1, vision_thread=True)
    try:
        queued_then_released(worker, [frame(1), frame(2), frame(3)])
        assert e.first_decoding.wait(10)  # frame 2 prepared, frame 1 in the decoder
        reset = worker.reset()  # frame 3 still queued: the reset drops it, not frame 2
        e.gate.set()
        reset.result(20)
    finally:
        worker.stop()
    assert e.calls == ["frame 1", "frame 2", "reset"]


def test_a_vision_error_costs_its_own_frames_and_the_worker_goes_on():
    e = OverlapEngine()
    errors = []
    worker = ModelWorker(e, queue_size=8, max_batch=1, vision_thread=True, on_ingest_error=errors.append)
    try:
        queued_then_released(worker, [frame(10), frame(15, "bad"), frame(11)])
        assert wait_for(lambda: len(e.calls) == 2 and worker.frames_failed == 1)
    finally:
        worker.stop()
    assert e.calls == ["frame 10", "frame 11"]
    assert worker.frames_failed == 1 and "broken frame" in str(errors[0])
    assert worker.camera_counts()["bad"] == {"failed": 1}
    assert not worker.alive
