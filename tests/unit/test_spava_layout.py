"""Spava's index math without processes: the ZigZag layout, its balance, the config's checks, the oracle mask."""

from __future__ import annotations

import pytest
import torch

from videokv_node.spava.config import SpavaConfig, SpavaConfigError
from videokv_node.spava.frames import frame_indices
from videokv_node.spava.layout import Layout, even_split, virtual_blocks_of
from videokv_node.spava.oracle import structured_mask


def test_even_split_gives_the_remainder_to_the_first_pieces():
    assert even_split(10, 4) == [3, 3, 2, 2]
    assert even_split(2, 4) == [1, 1, 0, 0]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_zigzag_pairs_block_r_with_its_mirror(world):
    held = [virtual_blocks_of(r, world, zigzag=True) for r in range(world)]
    assert held == [(r, 2 * world - 1 - r) for r in range(world)]
    assert sorted(v for pair in held for v in pair) == list(range(2 * world))


@pytest.mark.parametrize("world,total,question", [(2, 61, 4), (3, 47, 3), (4, 100, 7), (4, 13, 1)])
def test_local_ranges_tile_the_sequence_once(world, total, question):
    lay = Layout.build(SpavaConfig(anchor_len=5, passing_len=3), total, question, world)
    context = [p for r in range(world) for p in lay.local_positions(r) if lay.anchor_len <= p < lay.question_start]
    assert sorted(context) == list(range(lay.anchor_len, lay.question_start))
    anchor = [p for r in range(world) for p in range(*lay.anchor_slice(r))]
    assert anchor == list(range(lay.anchor_len))
    for v in range(lay.n_virtual):
        assert v in lay.blocks_of(lay.rank_of_block(v))


def test_anchor_never_reaches_into_the_question():
    lay = Layout.build(SpavaConfig(anchor_len=256), total=20, question_len=5, world=2)
    assert lay.anchor_len == 15 and lay.block_len(0) == 0


@pytest.mark.parametrize("world", [2, 3, 4, 8])
def test_zigzag_gives_every_rank_the_same_attention_work(world):
    """Paper eq. 7: with equal blocks, each rank's (query, key) pairs are the same; without ZigZag they grow with the rank."""
    block, passing, anchor = 32, 8, 16
    total = anchor + 2 * world * block + 4
    cfg = SpavaConfig(anchor_len=anchor, passing_len=passing)
    lay = Layout.build(cfg, total, 4, world)
    work = [lay.prefill_work(r) for r in range(world)]
    assert len({w["blocks"] for w in work}) == 1
    # eq. 7 of the paper, per rank: 2 blocks x anchor + (2W - 1) passing blocks + 2 causal blocks
    assert work[0]["blocks"] == 2 * block * anchor + (2 * world - 1) * passing * block + block * (block + 1)
    plain = Layout.build(SpavaConfig(anchor_len=anchor, passing_len=passing, zigzag=False), total, 4, world)
    plain_work = [plain.prefill_work(r)["blocks"] for r in range(world)]
    assert plain_work == sorted(plain_work) and plain_work[0] < plain_work[-1]


@pytest.mark.parametrize("bad", [dict(anchor_len=-1), dict(passing_len=-2), dict(pool_window=4), dict(pool_window=0),
                                 dict(timeout_s=0), dict(question_rank=-1)])
def test_config_refuses_bad_values(bad):
    with pytest.raises(SpavaConfigError):
        SpavaConfig(**bad)


def test_config_refuses_a_question_rank_outside_the_world():
    with pytest.raises(SpavaConfigError, match="question_rank"):
        Layout.build(SpavaConfig(question_rank=2), total=20, question_len=2, world=2)


def test_structured_mask_rows_by_hand():
    """anchor 2, blocks of 2 (W=1: two virtual blocks), question 2, passing 1 chosen by a planted key."""
    lay = Layout.build(SpavaConfig(anchor_len=2, passing_len=1, pool_window=1), total=8, question_len=2, world=1)
    k = torch.zeros(1, 8, 2, dtype=torch.float64)
    k[0, 3] = torch.tensor([1.0, 0.0])  # block 0 = positions 2, 3: key 3 matches the question
    q = torch.zeros(1, 8, 2, dtype=torch.float64)
    q[0, 6:] = torch.tensor([1.0, 0.0])
    m = structured_mask(lay, q, k, pool_window=1)[0].int()
    expect = torch.tensor([
        [1, 0, 0, 0, 0, 0, 0, 0],  # anchor: causal
        [1, 1, 0, 0, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],  # block 0: anchor + itself causally
        [1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 0, 1, 1, 0, 0, 0],  # block 1: anchor + passing key 3 + itself
        [1, 1, 0, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1, 1, 0],  # question: fully causal
        [1, 1, 1, 1, 1, 1, 1, 1],
    ])
    assert torch.equal(m, expect)


@pytest.mark.parametrize("n_frames,world", [(64, 8), (10, 2), (3, 2), (7, 3)])
def test_frames_are_dealt_over_virtual_hosts_like_the_context(n_frames, world):
    """Eq. 6: 2W virtual shares differing by at most one; rank r encodes shares r and 2W-1-r; every frame once."""
    shares = [frame_indices(n_frames, world, r) for r in range(world)]
    assert sorted(i for s in shares for i in s) == list(range(n_frames))
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 2
    assert frame_indices(10, 2, 0) == [0, 1, 2, 8, 9] and frame_indices(10, 2, 1) == [3, 4, 5, 6, 7]
