"""The engine's collaborators, each alone (issue 45): the engine composes them and is no mixin; the frame tables,
the caps, the model runner, the question reader and the ingest pipeline keep their contracts on tiny inputs."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.unit.helpers import random_frames
from tests.unit.test_policies import ADAPTER, block, ids, store_with
from videokv_node.memory import GenerationConfig, MemoryConfig, Question, RequestError, VideoMemoryEngine
from videokv_node.memory.context.encoding import EncodeJob, Unit
from videokv_node.memory.context.model_runner import ModelRunner
from videokv_node.memory.frames import caps
from videokv_node.memory.frames.ingest_pipeline import IngestPipeline
from videokv_node.memory.policies.factory import make_policy
from videokv_node.memory.questions.answering import Answerer
from videokv_node.memory.questions.locate import Locator
from videokv_node.memory.questions.question_reader import QuestionReader
from videokv_node.memory.records.still_config import RedundancyConfig
from videokv_node.memory.snapshot.engine_state import EngineState
from videokv_node.memory.store.block import Tier
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.memory.store.frame_tables import FrameTables
from videokv_node.pose import Pose


def tiny_engine(adapter, policy: str = "full", frames: int = 8, **over) -> VideoMemoryEngine:
    T, sink = adapter.tokens_per_frame, len(adapter.prefix_ids())
    cfg = MemoryConfig(policy=policy, budget_tokens=sink + frames * T, local_window_tokens=T, page_tokens=4, **over)
    return VideoMemoryEngine(adapter, cfg, GenerationConfig(max_new_tokens=2, max_new_tokens_limit=4))


def test_the_engine_composes_collaborators_and_is_no_mixin(tiny_adapter):
    assert VideoMemoryEngine.__mro__ == (VideoMemoryEngine, object)
    e = tiny_engine(tiny_adapter)
    parts = {"runner": ModelRunner, "pipeline": IngestPipeline, "reader": QuestionReader, "answerer": Answerer,
             "locator": Locator, "state": EngineState, "tables": FrameTables}
    assert all(isinstance(getattr(e, name), cls) for name, cls in parts.items())
    # One settings object: a config set on the engine is the one its collaborators read.
    e.generation = dataclasses.replace(e.generation, max_new_tokens_limit=3)
    assert e.reader.settings.generation.max_new_tokens_limit == 3 and e.pipeline.settings is e.settings
    e.close()


# --- FrameTables ----------------------------------------------------------------
def test_frame_tables_keep_what_memory_cites_or_may_cite():
    store = store_with([4] * 3)  # blocks 0, 1, 2 at stamps 1 s, 2 s, 3 s of camera "cam"
    tables = FrameTables()
    keys = [("cam", s * 10**9) for s in (1, 2, 3, 4, 5)]
    tables.note(keys, [Pose(float(i), 0.0, 0.0) if i != 1 else None for i in range(5)], [("cup",), (), ("dog", "cup"), (), ("cat",)])
    assert set(tables.poses) == set(keys) - {keys[1]} and set(tables.words) == {keys[0], keys[2], keys[4]}
    by_id = {b.block_id: b for b in store.blocks()}
    assert tables.words_of(by_id[2]) == ("dog", "cup")
    assert set(tables.pending_poses(store)) == {keys[3], keys[4]}  # frames 4 s and 5 s: no block cites them
    tables.prune(store, pending=[])  # no eviction since: nothing scanned
    assert len(tables.poses) == 4
    store.evict(by_id[0])
    tables.prune(store, pending=[keys[3]])  # frame 1 s left memory; 4 s pending, 5 s newer than every block
    assert set(tables.poses) == {keys[2], keys[3], keys[4]} and set(tables.words) == {keys[2], keys[4]}
    tables.clear()
    assert tables.poses == {} and tables.words == {}


# --- caps -----------------------------------------------------------------------
@pytest.mark.parametrize("policy, offloaded", [("full", []), ("rekv", [0, 1])])
def test_caps_move_the_oldest_until_the_budget_holds(policy, offloaded):
    """5 blocks of 4 tokens in 2 layers, a budget of 12 tokens a layer: the 2 oldest leave the device; ``full``
    has no offload tier (evicted, counted), ``rekv`` offloads them."""
    store = store_with([4] * 5)
    p = make_policy(MemoryConfig(policy=policy, budget_tokens=1000, local_window_tokens=4), ADAPTER)
    caps.enforce_caps(store, p, budget_tokens=12, sink_tokens=0, n_layers=2)
    assert ids(store.blocks(Tier.RESIDENT)) == [2, 3, 4]
    assert ids(store.blocks(Tier.OFFLOADED)) == offloaded
    assert store.evicted_blocks == 2 - len(offloaded)


# --- ModelRunner -----------------------------------------------------------------
def test_model_runner_ids_encoding_and_text(tiny_adapter):
    a = tiny_adapter
    store = BlockStore(a.geometry, a.device, 0, 4)
    runner = ModelRunner(a, store, make_policy(MemoryConfig(policy="full"), a), FrameTables())
    assert runner.sink.n_tokens == len(a.prefix_ids()) and runner.next_block_id == 0
    frame = random_frames(1, seed=1)[0]
    unit = Unit(feat=a.encode_frames([frame.rgb])[0], offsets=a.frame_positions(0), camera="cam", stamp_ns=frame.stamp_ns)
    provisional = runner.encode_units(EncodeJob([unit, unit]), provisional=True)
    assert [b.block_id for b in provisional] == [-1, -2] and runner.next_block_id == 0  # no id spent
    kept = runner.encode_units(EncodeJob([unit]))
    assert [b.block_id for b in kept] == [0] and runner.new_block_id() == 1 and runner.next_block_id == 2
    assert len(store) == 0  # the runner never stores
    torch.testing.assert_close(kept[0].layers[0].keys, provisional[0].layers[0].keys)  # the same pass, the same KV
    q = runner.probe("what is there?")
    assert q.shape == (a.geometry.n_layers, len(a.text_ids("what is there?")), a.geometry.n_q_heads, a.geometry.head_dim)


# --- QuestionReader ----------------------------------------------------------------
def test_question_reader_refuses_before_any_work_and_filters_by_camera_and_window(tiny_adapter):
    e = tiny_engine(tiny_adapter)
    with pytest.raises(RequestError, match="no frames in memory"):
        e.ask(Question("what is there?", max_new_tokens=1))
    e.ingest(random_frames(3, seed=2))
    for bad, why in [(Question(" "), "empty"), (Question("q", options=["a"]), "at least 2"),
                     (Question("q", since_ns=5, until_ns=4), "is after until"), (Question("q", max_new_tokens=9), "exceeds the limit")]:
        with pytest.raises(RequestError, match=why):
            e.reader.validate(bad)
    stamps = [b.stamp_ns for b in e.store.blocks()]
    assert [b.stamp_ns for b in e.reader.candidates(Question("q", since_ns=stamps[1]))] == stamps[1:]
    assert e.reader.candidates(Question("q", cameras=["other"])) == []
    assert QuestionReader.matches(Question("q", cameras=["cam"], until_ns=5), "cam", (3, 5))
    assert not QuestionReader.matches(Question("q", until_ns=5), "cam", (3, 6))
    e.close()


# --- IngestPipeline ------------------------------------------------------------------
def test_ingest_pipeline_counts_merged_still_frames_and_their_time(tiny_adapter):
    e = tiny_engine(tiny_adapter, redundancy=RedundancyConfig(enabled=True))
    frame = random_frames(1, seed=3)[0]
    still = dataclasses.replace(frame, stamp_ns=frame.stamp_ns + 10**9)
    e.ingest([frame])
    assert e.pipeline.merge_still([still]) == [] and e.pipeline.ingested == 2
    (only,) = e.store.blocks()
    assert only.stamps_ns == (frame.stamp_ns,) and only.last_stamp(frame.stamp_ns) == still.stamp_ns
    e.close()
