"""StreamKV's online semantic segmenter on hand-made features: exact boundaries, exact merges.

Features are tiny (T, D) float64 tensors built from basis vectors or unit
vectors at known angles, so every cosine similarity can be read off the test.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from videokv_node.memory.config import ConfigError
from videokv_node.memory.scoring.segmenter import SegmenterConfig, SemanticSegmenter

SHAPE = (2, 2)  # (T, D): 4 values flattened, enough for 4 orthogonal frames


def e(*weights: float) -> torch.Tensor:
    """A (2, 2) float64 feature whose flattened values are ``weights`` (padded with zeros)."""
    flat = torch.zeros(4, dtype=torch.float64)
    flat[: len(weights)] = torch.tensor(weights, dtype=torch.float64)
    return flat.reshape(SHAPE)


def at(degrees: float) -> torch.Tensor:
    """A unit feature at an angle in the first plane: cos(a - b) is the similarity of two of them."""
    r = math.radians(degrees)
    return e(math.cos(r), math.sin(r))


def segmenter(threshold: float = 0.9, min_frames: int = 1, max_frames: int = 100) -> SemanticSegmenter:
    return SemanticSegmenter(SegmenterConfig(threshold=threshold, min_frames=min_frames, max_frames=max_frames))


def member_ids(members) -> list[list[int]]:
    return [m.item_ids for m in members]


# --- config ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"threshold": 1.01}, "threshold"),
        ({"threshold": -1.5}, "threshold"),
        ({"threshold": float("nan")}, "threshold"),
        ({"min_frames": 0}, "min_frames"),
        ({"min_frames": 5, "max_frames": 4}, "max_frames"),
    ],
)
def test_config_rejects(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        SegmenterConfig(**kwargs)
    assert issubclass(ConfigError, ValueError)


def test_config_edges_accepted():
    SegmenterConfig(threshold=-1.0, min_frames=1, max_frames=1)
    SegmenterConfig(threshold=1.0, min_frames=3, max_frames=3)


# --- boundaries -------------------------------------------------------------------
def test_identical_frames_never_split_even_at_threshold_one():
    frame = torch.randn(7, 5, generator=torch.Generator().manual_seed(0))  # float32
    seg = segmenter(threshold=1.0, min_frames=1, max_frames=1000)
    for i in range(200):
        assert seg.push(i, frame.clone()) == []
    assert seg.pending_similarities == [1.0] * 199
    closed = seg.flush()
    assert closed.item_ids == list(range(200)) and len(closed.members) == 200


def test_sharp_change_starts_a_segment_only_after_min_frames():
    a, b, c = e(1), e(0, 1), e(0, 0, 1)  # pairwise similarity 0
    seg = segmenter(threshold=0.5, min_frames=3)
    pushes = [(0, a), (1, b), (2, b), (3, c), (4, c), (5, c), (6, a)]
    closed = {i: seg.push(i, f) for i, f in pushes}
    assert [i for i, got in closed.items() if got] == [3, 6]
    assert closed[3][0].item_ids == [0, 1, 2]  # the change at 1 came too early: inside the window
    assert closed[6][0].item_ids == [3, 4, 5]
    assert member_ids(seg.pending) == [[6]]
    assert seg.flush().item_ids == [6]  # the last segment may be shorter than min_frames


def test_similarity_equal_to_threshold_is_not_a_boundary():
    seg = segmenter(threshold=0.5)
    seg.push(0, e(1))
    assert seg.push(1, e(1, 1, 1, 1)) == []  # cosine exactly 1 / sqrt(4) = 0.5
    seg = segmenter(threshold=0.5000001)
    seg.push(0, e(1))
    assert len(seg.push(1, e(1, 1, 1, 1))) == 1


# --- merging -----------------------------------------------------------------------
def test_merge_picks_the_most_similar_pair_and_recomputes_neighbours():
    seg = segmenter(threshold=-1.0, max_frames=3)  # threshold -1: never a boundary
    for i, f in enumerate([e(1), e(0, 1), e(0, 1, 1)]):
        seg.push(i, f)
    assert seg.pending_similarities == pytest.approx([0.0, 1 / math.sqrt(2)])
    seg.push(3, e(0, 0, 0, 1))  # 4 > 3 members: (1, 2) is the most similar pair
    assert member_ids(seg.pending) == [[0], [1, 2], [3]]
    assert [m.weight for m in seg.pending] == [1, 2, 1]
    torch.testing.assert_close(seg.pending[1].feature, e(0, 1, 0.5))
    assert seg.pending_similarities == [0.0, 0.0]

    seg.push(4, e(0, 0.2, 0, 1))  # similarity 1 / sqrt(1.04) to frame 3: (3, 4) merges
    assert member_ids(seg.pending) == [[0], [1, 2], [3, 4]]
    torch.testing.assert_close(seg.pending[2].feature, e(0, 0.1, 0, 1))
    # Recomputed from the merged features, not left at frame 2 vs frame 3's 0.
    assert seg.pending_similarities == pytest.approx([0.0, 0.1 / math.sqrt(1.25 * 1.01)])

    seg.push(5, e(0, 1))  # 0.1 / sqrt(1.01) to the (3, 4) member beats 0.089: a weight-2 + weight-1 merge
    assert member_ids(seg.pending) == [[0], [1, 2], [3, 4, 5]]
    assert seg.pending[2].weight == 3
    torch.testing.assert_close(seg.pending[2].feature, (e(0, 0, 0, 1) + e(0, 0.2, 0, 1) + e(0, 1)) / 3)


def test_merge_ties_take_the_earliest_pair():
    seg = segmenter(threshold=-1.0, max_frames=2)
    for i, degrees in enumerate([0, 10, 20]):
        seg.push(i, at(degrees))
    assert member_ids(seg.pending) == [[0, 1], [2]]


def test_boundaries_compare_raw_frames_not_merged_members():
    """Threshold cos 15 deg. Frame 3 is 14 deg from frame 2 but 16.5 deg from the (1, 2) member."""
    seg = segmenter(threshold=math.cos(math.radians(15)), max_frames=2)
    for i, degrees in enumerate([0, 10, 15]):
        assert seg.push(i, at(degrees)) == []
    assert member_ids(seg.pending) == [[0], [1, 2]]  # 5 deg apart beats 10
    assert seg.push(3, at(29)) == []
    assert member_ids(seg.pending) == [[0, 1, 2], [3]]  # 12.5 deg (0 to the 12.5 deg member) beats 16.5
    assert seg.push(4, at(50))[0].item_ids == [0, 1, 2, 3]


# --- segments ------------------------------------------------------------------------
def test_summary_feature_is_the_mean_of_the_original_frames():
    frames = [at(d) for d in (0, 10, 15, 29)]
    seg = segmenter(threshold=-1.0, max_frames=2)
    for i, f in enumerate(frames):
        seg.push(i, f)
    closed = seg.flush()
    assert [m.weight for m in closed.members] == [3, 1]
    torch.testing.assert_close(closed.summary_feature(), torch.stack(frames).mean(dim=0))
    assert (closed.first_item_id, closed.last_item_id, closed.n_frames) == (0, 3, 4)


def test_flush_and_reset():
    seg = segmenter()
    assert seg.flush() is None
    seg.push(0, e(1))
    assert seg.flush().item_ids == [0]
    assert seg.push(1, e(0, 1)) == []  # after a flush a frame opens a new segment, whatever its similarity
    seg.push(2, e(0, 1))
    seg.reset()  # drops the open segment and the id/shape history
    assert seg.pending == [] and seg.flush() is None
    seg.push(0, torch.zeros(3, 3))
    assert member_ids(seg.pending) == [[0]]


def test_misuse_raises():
    seg = segmenter()
    seg.push(5, e(1))
    with pytest.raises(ValueError, match="increase"):
        seg.push(5, e(1))
    with pytest.raises(ValueError, match="shape"):
        seg.push(6, torch.zeros(4, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"\(T, D\)"):
        seg.push(6, torch.zeros(4))
    assert member_ids(seg.pending) == [[5]]  # refused pushes change nothing


def test_features_are_copied_and_held_in_at_least_float32():
    seg = segmenter()
    buffer = torch.ones(2, 2, dtype=torch.bfloat16)
    seg.push(0, buffer)
    buffer.zero_()  # a caller reusing its buffer
    assert seg.pending[0].feature.dtype == torch.float32
    assert torch.equal(seg.pending[0].feature, torch.ones(2, 2))


# --- random streams -----------------------------------------------------------------
PALETTE = torch.randn(3, 3, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64)  # 3 scenes, (T, D)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a.reshape(1, -1), b.reshape(1, -1)))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    runs=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 12)), min_size=1, max_size=6),  # (scene, frames)
    noise=st.sampled_from([0.0, 0.05, 0.3]),
    threshold=st.sampled_from([-1.0, 0.0, 0.9, 0.99, 1.0]),
    min_frames=st.integers(1, 4),
    extra=st.integers(0, 4),
    seed=st.integers(0, 2**16),
)
def test_random_streams(runs, noise, threshold, min_frames, extra, seed):
    """The full contract on random streams: the boundary rule, the size limits, the id partition, the means."""
    max_frames = min_frames + extra
    seg = segmenter(threshold, min_frames, max_frames)
    g = torch.Generator().manual_seed(seed)
    scenes = [scene for scene, length in runs for _ in range(length)]
    ids = torch.randint(1, 4, (len(scenes),), generator=g).cumsum(0).tolist()  # strictly increasing, with gaps
    frames = {i: PALETTE[s] + noise * torch.randn(3, 4, generator=g, dtype=torch.float64) for i, s in zip(ids, scenes)}
    segments, previous = [], None
    for i in ids:
        open_before = len(seg.pending)
        closed = seg.push(i, frames[i])
        if open_before:  # the boundary rule, with s_t from the raw adjacent frames
            s_t = 1.0 if torch.equal(frames[previous], frames[i]) else cosine(frames[previous], frames[i])
            if abs(s_t - threshold) > 1e-12:  # closer is rounding's call
                assert bool(closed) == (s_t < threshold and open_before >= min_frames)
        else:
            assert closed == []
        for segment in closed:
            assert min_frames <= len(segment.members) <= max_frames
        assert 1 <= len(seg.pending) <= max_frames
        pending = seg.pending
        assert seg.pending_similarities == pytest.approx(
            [cosine(a.feature, b.feature) for a, b in zip(pending, pending[1:])], abs=1e-12
        )
        segments += closed
        previous = i
    last = seg.flush()
    assert 1 <= len(last.members) <= max_frames
    segments.append(last)

    assert [i for s in segments for m in s.members for i in m.item_ids] == ids  # a partition, in push order
    for s in segments:
        for m in s.members:
            assert m.weight == len(m.item_ids)
            torch.testing.assert_close(m.feature, torch.stack([frames[i] for i in m.item_ids]).mean(dim=0))
        torch.testing.assert_close(s.summary_feature(), torch.stack([frames[i] for i in s.item_ids]).mean(dim=0))
