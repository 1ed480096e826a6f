"""Still frames cost nothing (issue 36, memory/frames/still.py): the thumbnail test against a reference
written here, a still stretch broken by a thing kept exactly as stored view / thing / view again,
spans under every policy and the TGV-KV stage, evidence, locate, stats, snapshots, and parity with
the feature off."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tests.unit.helpers import random_frames
from videokv_node.memory import Frame, GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.memory.config import ConfigError, HermesConfig, MuKVConfig, StreamKVConfig
from videokv_node.memory.records.still_config import RedundancyConfig
from videokv_node.memory.frames.still import StillFilter, is_still, thumbnail
from videokv_node.memory.snapshot.format import load_snapshot, save_snapshot
from videokv_node.pose import Pose, yaw_quaternion

POLICY_CONFIGS = {
    "full": {},
    "rekv": {},
    "streamkv": dict(streamkv=StreamKVConfig(similarity_threshold=0.9, min_segment_frames=2, max_segment_frames=3, retrieve_frames=3)),
    "hermes": dict(hermes=HermesConfig(chunk_frames=2, reindex_at=0.005)),
    "mukv": dict(mukv=MuKVConfig(retrieve_patch=3, retrieve_frame=2, retrieve_segment=1)),
}
ON, OFF = RedundancyConfig(enabled=True), RedundancyConfig(enabled=False)
H, W = 48, 64


def view(seed: int) -> np.ndarray:
    """A smooth random view (a still scene): blocks of 8 x 8 pixels of random colour."""
    rng = np.random.default_rng(seed)
    return np.kron(rng.integers(40, 216, (H // 8, W // 8, 3)), np.ones((8, 8, 1))).astype(np.uint8)


def noisy(img: np.ndarray, seed: int, sigma: float = 1.5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(img + rng.normal(0, sigma, img.shape), 0, 255).astype(np.uint8)


def with_thing(img: np.ndarray) -> np.ndarray:
    out = img.copy()
    out[8:24, 16:32] = (255, 0, 0)  # a red square: a needle seen for a moment
    return out


def stamp(i: int) -> int:
    return (i + 1) * 2 * 10**9


def pose_of(i: int) -> Pose:
    return Pose.make("odom", (float(i), 0.0, 0.0), yaw_quaternion(0.0))


def stream(kinds: str, seed: int = 0) -> list[Frame]:
    """One frame per letter: 'a'/'b' a still view (fresh noise each), 't' view a with the thing."""
    views = {"a": view(1), "b": view(2), "t": with_thing(view(1))}
    return [Frame("cam", stamp(i), noisy(views[k], seed * 1000 + i), pose_of(i)) for i, k in enumerate(kinds)]


def engine(adapter, policy: str, redundancy: RedundancyConfig = ON, budget_frames: int = 40, **over) -> VideoMemoryEngine:
    T, L = adapter.tokens_per_frame, adapter.geometry.n_layers
    sink = len(adapter.prefix_ids())
    page_bytes = 4 * adapter.geometry.bytes_per_token // L
    cfg = dict(policy=policy, budget_tokens=sink + (2 + budget_frames) * T, local_window_tokens=T,
               offload_bytes=40 * L * (T // 4) * page_bytes, page_tokens=4, retrieve_frames=2, redundancy=redundancy)
    cfg.update(POLICY_CONFIGS[policy])
    cfg.update(over)
    return VideoMemoryEngine(adapter, MemoryConfig(**cfg), GenerationConfig(max_new_tokens=2, max_new_tokens_limit=4))


def feed(e: VideoMemoryEngine, frames: list[Frame], batch: int = 1) -> None:
    for i in range(0, len(frames), batch):
        e.ingest(frames[i:i + batch])


def frame_blocks(e: VideoMemoryEngine) -> list[tuple[int, int, int]]:
    """(stamp, span end, frames merged) of each held frame block, in time order."""
    return sorted((b.stamp_ns, b.span_end_ns, b.frames_merged) for b in e.store.blocks() if b.kind == "frame" and b.stream == "frame")


# --- the test itself --------------------------------------------------------------------------------
def test_thumbnail_is_the_area_mean_of_grey_over_cells_that_cover_every_pixel():
    img = np.random.default_rng(0).integers(0, 256, (7, 10, 3), dtype=np.uint8)
    thumb = thumbnail(img, 3)
    rows, cols = [0, 2, 4, 7], [0, 3, 6, 10]  # np.linspace(0, n, 4) floored, written out
    for r in range(3):
        for c in range(3):
            cell = img[rows[r]:rows[r + 1], cols[c]:cols[c + 1]].astype(np.float64)
            assert thumb[r, c] == pytest.approx(cell.mean(), abs=1e-4)
    assert thumbnail(img, 100).shape == (7, 10)  # never more cells than pixels
    assert thumbnail("some text", 32) == "some text"
    with pytest.raises(ValueError, match="H, W, 3"):
        thumbnail(np.zeros((4, 4), np.uint8), 2)


def test_noise_is_still_a_thing_or_another_view_is_not():
    base = view(1)
    big = np.kron(base, np.ones((10, 10, 1), np.uint8))  # 480 x 640, the hour's camera size
    cfg = RedundancyConfig(enabled=True)
    for sigma in (1.5, 4.0):  # the hour stream's sensor noise range
        assert is_still(thumbnail(noisy(big, 1, sigma), 32), thumbnail(noisy(big, 2, sigma), 32), cfg)
    assert not is_still(thumbnail(with_thing(base), 32), thumbnail(base, 32), cfg)
    assert not is_still(thumbnail(view(2), 32), thumbnail(base, 32), cfg)
    assert is_still("a", "a", cfg) and not is_still("a", "b", cfg)


@pytest.mark.parametrize("bad", [dict(max_cell_diff=-1.0), dict(max_mean_diff=300.0), dict(grid=0)])
def test_bad_thresholds_are_refused(bad):
    with pytest.raises(ConfigError, match="memory.redundancy"):
        RedundancyConfig(**bad)


def test_filter_compares_with_the_last_stored_frame_so_a_drift_cannot_merge_forever():
    f = StillFilter(RedundancyConfig(enabled=True, max_cell_diff=3.0, max_mean_diff=3.0))
    base = view(1).astype(np.int16)
    drift = [Frame("cam", stamp(i), np.clip(base + i, 0, 255).astype(np.uint8)) for i in range(8)]  # +1 grey a frame
    kept, _ = f.split(drift, lambda b: True)
    # against the stored frame: 0 stored, 1-3 merged (diff <= 3), 4 stored, 5-7 merged; against the last seen all would merge
    assert [fr.stamp_ns for fr in kept] == [stamp(0), stamp(4)]
    assert f.frames_merged == 6


# --- in the engine --------------------------------------------------------------------------------
def test_a_still_stretch_broken_by_a_thing_keeps_the_things_frames_as_their_own_blocks(tiny_adapter):
    e = engine(tiny_adapter, "rekv")
    feed(e, stream("aaaattaaab"))
    assert frame_blocks(e) == [
        (stamp(0), stamp(3), 3),  # the view, frames 1-3 merged
        (stamp(4), stamp(5), 1),  # the thing, its two frames: never merged into the view
        (stamp(6), stamp(8), 2),  # the view again, stored anew (it differs from the thing's frame)
        (stamp(9), 0, 0),  # another view
    ]
    stats = e.stats()
    assert (stats.frames_ingested, stats.frames_merged, stats.frames_in_memory) == (10, 6, 4)
    span = next(b for b in e.store.blocks() if b.stamp_ns == stamp(0))
    assert span.span_end_pose == pose_of(3) and span.poses == (pose_of(0),)


def test_a_batch_merges_as_frames_one_at_a_time(tiny_adapter):
    one, four = engine(tiny_adapter, "rekv"), engine(tiny_adapter, "rekv")
    feed(one, stream("aaaattaaab"))
    feed(four, stream("aaaattaaab"), batch=4)
    assert frame_blocks(one) == frame_blocks(four)


def test_the_stored_frame_gone_the_next_still_frame_is_stored(tiny_adapter):
    e = engine(tiny_adapter, "full", budget_frames=0)  # room for 2 frames: full evicts the oldest
    a = stream("aa")
    other = [Frame("cam2", stamp(i), view(10 + i)) for i in (1, 2)]  # another camera pushes cam's frame out
    feed(e, [a[0], *other])
    assert stamp(0) not in {b.stamp_ns for b in e.store.blocks()}
    feed(e, [Frame("cam", stamp(3), a[1].rgb)])
    assert (stamp(3), 0, 0) in frame_blocks(e) and e.stats().frames_merged == 0  # stored, not merged into an evicted block


@pytest.mark.parametrize("policy", list(POLICY_CONFIGS))
@pytest.mark.parametrize("stage", ["none", "tgvkv"])
def test_every_policy_stores_spans_answers_cites_and_snapshots_them(tiny_adapter, tmp_path, policy, stage):
    frames = stream("aaaattaaabbbb")
    on, off = engine(tiny_adapter, policy, question_stage=stage), engine(tiny_adapter, policy, OFF, question_stage=stage)
    feed(on, frames)
    feed(off, frames)
    assert on.stats().frames_merged == 9 and off.stats().frames_merged == 0
    assert on.stats().bytes_resident + on.stats().bytes_offloaded < off.stats().bytes_resident + off.stats().bytes_offloaded
    held = {s for b in on.store.blocks() for s in b.cited_stamps}
    assert held <= {stamp(i) for i in (0, 4, 6, 9)}  # merged frames are in no block's stamps
    spans = {(max(b.stamps_ns), b.span_end_ns) for b in on.store.blocks() if b.span_end_ns}  # a span grows a block's newest frame
    assert spans and spans <= {(stamp(0), stamp(3)), (stamp(4), stamp(5)), (stamp(6), stamp(8)), (stamp(9), stamp(12))}
    answer = on.ask(Question("What colour is the square?", options=["red", "blue"]))
    for ev in answer.evidence:  # a segment block cited alone carries the span of its newest frame only
        assert ev.last == dict(spans).get(ev.stamp_ns, ev.stamp_ns) or (policy == "mukv" and ev.last == ev.stamp_ns)
        if ev.last_stamp_ns:
            assert ev.last_pose == pose_of(round(ev.last_stamp_ns / 2e9) - 1)
    save_snapshot(on, tmp_path / "s")
    back = engine(tiny_adapter, policy, question_stage=stage)
    load_snapshot(back, tmp_path / "s")
    assert {(b.block_id, b.stamp_ns, b.span_end_ns, b.frames_merged, b.span_end_pose) for b in back.store.blocks()} == {
        (b.block_id, b.stamp_ns, b.span_end_ns, b.frames_merged, b.span_end_pose) for b in on.store.blocks()}
    assert back.ask(Question("What colour is the square?", options=["red", "blue"])).option_scores == answer.option_scores


def test_a_window_inside_a_span_sees_the_span(tiny_adapter):
    e = engine(tiny_adapter, "rekv")
    feed(e, stream("aaaaab"))
    answer = e.ask(Question("What is there?", options=["x", "y"], since_ns=stamp(2), until_ns=stamp(3)))
    assert [ev.stamp_ns for ev in answer.evidence] == [stamp(0)]  # the stored frame, standing for stamps 0-4
    assert answer.evidence[0].last == stamp(4)


def test_locate_gives_a_spans_last_stamp(tiny_adapter):
    from videokv_node.memory.questions.locate import LocateQuery

    e = engine(tiny_adapter, "rekv")
    feed(e, stream("aaattt"))
    result = e.locate(LocateQuery("the red square", top_k=2))
    lasts = {m.stamp_ns: m.last_stamp_ns for m in result.moments}
    assert lasts == {stamp(0): stamp(2), stamp(3): stamp(5)}


# --- parity with the feature off -----------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["rekv", "streamkv", "mukv"])
def test_on_equals_off_bit_for_bit_where_no_frame_is_still(tiny_adapter, policy):
    frames = random_frames(9, seed=3)  # every frame its own view
    on, off = engine(tiny_adapter, policy, budget_frames=4), engine(tiny_adapter, policy, OFF, budget_frames=4)
    feed(on, frames)
    feed(off, frames)
    ids = lambda e: [(b.block_id, b.stamps_ns, b.tier, b.entries) for b in e.store.blocks()]
    assert ids(on) == ids(off) and on.stats().frames_merged == 0
    for a, b in zip(on.store.blocks(), off.store.blocks()):
        for layer in (l for l in range(tiny_adapter.geometry.n_layers) if a.layers[l] is not None):
            ka, va = on.store.layer_kv(a, layer)
            kb, vb = off.store.layer_kv(b, layer)
            assert torch.equal(ka, kb) and torch.equal(va, vb)
    q = Question("What is in the video?", options=["a", "b", "c"])
    x, y = on.ask(q), off.ask(q)
    assert (x.option_scores, x.evidence) == (y.option_scores, y.evidence)
    assert dataclasses.replace(on.stats(), ingest_ms_p50=0, ingest_ms_p95=0) == dataclasses.replace(off.stats(), ingest_ms_p50=0, ingest_ms_p95=0)


def test_off_stores_one_block_per_frame_as_before(tiny_adapter):
    e = engine(tiny_adapter, "rekv", OFF)
    feed(e, stream("aaaattaaab"))
    assert frame_blocks(e) == [(stamp(i), 0, 0) for i in range(10)]
    assert e.still is None and e.stats().frames_merged == 0


def test_on_in_the_robot_preset_off_in_the_papers():
    from videokv_node.memory.config import POLICIES
    from videokv_node.memory.records.presets import preset_memory_config

    assert MemoryConfig().redundancy.enabled
    for policy in POLICIES:
        assert preset_memory_config("robot", policy).redundancy.enabled
        assert not preset_memory_config("paper", policy).redundancy.enabled  # every seed encodes every frame
