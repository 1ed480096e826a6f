"""Policies and their helpers on hand-made blocks: exact selections, exact victims, exact errors.

No model here: blocks are built by hand in a BlockStore with a tiny geometry, so
each expected block id can be read off the test.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from videokv_node.memory.store.block import FrameBlock, LayerKV, Tier
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.memory.frames import caps
from videokv_node.memory.config import POLICIES, ConfigError, GenerationConfig, MemoryConfig, ReKVConfig
from videokv_node.memory.policies.factory import make_policy, policy_classes
from videokv_node.memory.policies.full import FullPolicy
from videokv_node.memory.policies.rekv import ReKVPolicy
from videokv_node.memory.policies.base import EncodeJob, recent_within
from videokv_node.memory.context.question_cache import question_context
from videokv_node.memory.context.selection import InPass, Static
from videokv_node.memory.store.block_index import Candidates
from videokv_node.memory.scoring.rekv import top_k_blocks
from videokv_node.models.adapter import KVGeometry, VideoLLMAdapter

GEO = KVGeometry(n_layers=2, n_kv_heads=2, head_dim=4, n_q_heads=2, dtype=torch.float32)


class NoModel:
    """What a policy reads of an adapter without running it: geometry and positions (1-D RoPE)."""

    geometry = GEO
    tokens_per_frame = 4
    position_dims = 1
    max_positions = 32768
    frame_span = 4
    text_positions = VideoLLMAdapter.text_positions
    frame_positions = VideoLLMAdapter.frame_positions
    pack = VideoLLMAdapter.pack


ADAPTER = NoModel()


def block(block_id: int, n_tokens: int = 4, camera: str = "cam") -> FrameBlock:
    shape = (GEO.n_kv_heads, n_tokens, GEO.head_dim)
    positions = torch.arange(100 + 10 * block_id, 100 + 10 * block_id + n_tokens)[None]
    return FrameBlock(
        block_id=block_id,
        camera=camera,
        stamp_ns=(block_id + 1) * 10**9,
        positions=positions,
        key_mean=torch.zeros(GEO.n_layers, GEO.n_kv_heads, GEO.head_dim),
        layers=[
            LayerKV(torch.arange(n_tokens), positions, torch.full(shape, float(block_id)), torch.full(shape, -float(block_id)))
            for _ in range(GEO.n_layers)
        ],
    )


def store_with(sizes: list[int], offloaded: int = 0) -> BlockStore:
    """Blocks 0..n-1 of the given sizes; the first ``offloaded`` of them moved to the arena."""
    store = BlockStore(GEO, torch.device("cpu"), offload_bytes=1 << 16, page_tokens=4)
    for i, n in enumerate(sizes):
        store.add(block(i, n))
    for b in list(store.blocks())[:offloaded]:
        store.offload(b)
    return store


def ids(blocks) -> list[int]:
    return [b.block_id for b in blocks]


def host_of(store: BlockStore) -> SimpleNamespace:
    """What a policy's ``select`` reads of the engine here: the store (no probe: none of these policies reads one)."""
    return SimpleNamespace(store=store)


# --- recent_within -----------------------------------------------------------
@pytest.mark.parametrize(
    "sizes, max_tokens, expected",
    [
        ([4, 4, 4, 4], 0, []),
        ([4, 4, 4, 4], 3, []),
        ([4, 4, 4, 4], 4, [3]),
        ([4, 4, 4, 4], 7, [3]),
        ([4, 4, 4, 4], 8, [2, 3]),
        ([4, 4, 4, 4], 16, [0, 1, 2, 3]),
        ([4, 4, 4, 4], 1000, [0, 1, 2, 3]),
        ([2, 9, 3, 1], 4, [2, 3]),  # 1 + 3 fit, + 9 does not
        ([2, 9, 3, 1], 12, [2, 3]),
        ([2, 9, 3, 1], 13, [1, 2, 3]),
        ([1, 9, 1, 1], 5, [2, 3]),  # a suffix: stops at the first block that does not fit, never skips it
        ([5], 4, []),
        ([], 10, []),
    ],
)
def test_recent_within(sizes, max_tokens, expected):
    blocks = [block(i, n) for i, n in enumerate(sizes)]
    assert ids(recent_within(blocks, max_tokens)) == expected


# --- ReKV --------------------------------------------------------------------
@pytest.mark.parametrize("window_frames, expected", [(1, [5]), (2, [4, 5]), (3, [3, 4, 5]), (10, [2, 3, 4, 5])])
def test_rekv_encoding_context_is_the_last_w_resident_frames(window_frames, expected):
    store = store_with([4] * 6, offloaded=2)  # blocks 0, 1 offloaded; 2..5 resident
    policy = ReKVPolicy(MemoryConfig(policy="rekv", budget_tokens=1000, local_window_tokens=4 * window_frames + 3), ADAPTER)
    assert ids(policy.encoding_context(store, EncodeJob([]))) == expected
    assert all(b.tier is Tier.RESIDENT for b in policy.encoding_context(store, EncodeJob([])))


@pytest.mark.parametrize(
    "window_frames, candidates, fixed, pool",
    [
        (2, [0, 1, 2, 3, 4, 5], [4, 5], [0, 1, 2, 3]),
        (1, [0, 1, 2, 3, 4, 5], [5], [0, 1, 2, 3, 4]),
        (3, [0, 2, 4], [0, 2, 4], []),
        (2, [1, 3, 5], [3, 5], [1]),  # the window is over the candidates, not over memory
        (6, [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5], []),
        (2, [5], [5], []),
    ],
)
def test_rekv_question_selection_splits_window_and_pool(window_frames, candidates, fixed, pool):
    store = store_with([4] * 6, offloaded=3)
    config = MemoryConfig(policy="rekv", budget_tokens=1000, local_window_tokens=4 * window_frames, retrieve_frames=3,
                          rekv=ReKVConfig(selection="layer"))  # ReKV's in-pass retrieval (shared: test_rekv_shared.py)
    by_id = {b.block_id: b for b in store.blocks()}
    selection = ReKVPolicy(config, ADAPTER).select(host_of(store), Candidates.of(store.index, [by_id[i] for i in candidates]), "q")
    assert ids(selection.fixed) == fixed
    assert ids(selection.pool.blocks()) == pool
    assert selection.k == 3


def test_full_takes_every_candidate_as_fixed():
    store = store_with([4] * 5, offloaded=0)
    policy = FullPolicy(MemoryConfig(policy="full", budget_tokens=1000, local_window_tokens=4), ADAPTER)
    by_id = {b.block_id: b for b in store.blocks()}
    selection = policy.select(host_of(store), Candidates.of(store.index, [by_id[i] for i in (0, 2, 3)]), "q")
    assert isinstance(selection, Static)  # fixed in every layer, nothing retrieved (no pool, no k)
    assert [ids(layer) for layer in selection.per_layer] == [[0, 2, 3]] * GEO.n_layers
    assert ids(policy.encoding_context(store, EncodeJob([]))) == [0, 1, 2, 3, 4]  # every resident block, whatever the window


def test_full_encoding_context_skips_offloaded_blocks():
    store = store_with([4] * 4, offloaded=2)
    policy = FullPolicy(MemoryConfig(policy="full", budget_tokens=1000, local_window_tokens=4), ADAPTER)
    assert ids(policy.encoding_context(store, EncodeJob([]))) == [2, 3]


def test_victims_are_the_oldest_of_their_tier():
    """Every policy's caps (memory/frames/caps.py: no policy picks its own victims)."""
    store = store_with([4] * 5, offloaded=2)
    assert caps.demotion_victim(store).block_id == 2
    assert caps.offload_victim(store).block_id == 0
    empty = store_with([])
    with pytest.raises(RuntimeError, match="no resident block"):
        caps.demotion_victim(empty)
    with pytest.raises(RuntimeError, match="no offloaded block"):
        caps.offload_victim(empty)


def test_policy_offload_flags():
    assert FullPolicy.uses_offload is False
    assert ReKVPolicy.uses_offload is True


def test_selections_by_mode():
    """A static set adds blocks in every layer; an in-pass retrieval whose pool fits in k is a static set
    of its fixed blocks and the pool; a static set for another number of layers, a bad k or query is refused."""
    store = store_with([4] * 4)
    b = {x.block_id: x for x in store.blocks()}
    s = Static.everywhere([b[0]], GEO.n_layers).plus([b[3]])
    assert [ids(layer) for layer in s.per_layer] == [[0, 3]] * GEO.n_layers
    pool = Candidates.of(store.index, [b[1], b[2]])
    fits = InPass((b[3],), pool, 2).settled(GEO.n_layers)
    assert isinstance(fits, Static) and [ids(layer) for layer in fits.per_layer] == [[3, 1, 2]] * GEO.n_layers
    assert InPass((b[3],), pool, 1).settled(GEO.n_layers).pool is pool
    with pytest.raises(RuntimeError, match="names 1 layers; the model has 2"):
        question_context(Static.everywhere([b[0]], 1), ADAPTER, store, None, None, None, None)
    with pytest.raises(ValueError, match="k must be >= 0"):
        InPass((), pool, -1)
    with pytest.raises(ValueError, match="query must be one of"):
        InPass((), pool, 1, query="answer")


# --- top_k_blocks ------------------------------------------------------------
def key_means_from_scores(scores: list[float]) -> torch.Tensor:
    """(N, H=2, D=4) key means whose score against ``QUERY`` is exactly ``scores`` (both heads equal)."""
    km = torch.zeros(len(scores), 2, 4)
    km[:, :, 0] = torch.tensor(scores)[:, None]
    return km


QUERY = torch.zeros(2, 4)
QUERY[:, 0] = 2.0  # score = sum over 2 heads of 2 * s / (H * sqrt(D)) = 2 * 2 * s / (2 * 2) = s


@pytest.mark.parametrize(
    "scores, k, expected",
    [
        ([0.1, 0.5, 0.3, 0.9], 2, [3, 1]),
        ([0.1, 0.5, 0.3, 0.9], 1, [3]),
        ([0.1, 0.5, 0.3, 0.9], 4, [3, 1, 2, 0]),
        ([0.1, 0.5, 0.3, 0.9], 10, [3, 1, 2, 0]),  # k larger than N: all, best first
        ([0.1, 0.5, 0.3, 0.9], 0, []),
        ([1.0, 1.0, 1.0], 2, [2, 1]),  # ties: the newer block first
        ([0.5, 2.0, 0.5, 2.0, 0.5], 3, [3, 1, 4]),
        ([-3.0, -1.0, -2.0], 2, [1, 2]),
    ],
)
def test_top_k_blocks(scores, k, expected):
    assert top_k_blocks(QUERY, key_means_from_scores(scores), k) == expected


def test_top_k_blocks_score_is_mean_over_heads():
    """Scores add over heads: block 0 scores 3 in head 0 only, block 1 4 in head 1 only, block 2 1 + 1."""
    query = torch.tensor([[1.0, 0.0], [0.0, 1.0]])  # (H=2, D=2)
    key_means = torch.tensor([[[3.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 4.0]], [[1.0, 0.0], [0.0, 1.0]]])  # (3, 2, 2)
    assert top_k_blocks(query, key_means, 3) == [1, 0, 2]


# --- configuration -----------------------------------------------------------
def test_make_policy_names():
    POLICY_CLASSES = policy_classes()
    assert set(POLICY_CLASSES) == set(POLICIES)
    for name in POLICIES:
        policy = make_policy(MemoryConfig(policy=name), ADAPTER)
        assert policy.name == name
        assert isinstance(policy, POLICY_CLASSES[name])


def test_unknown_policy_is_a_config_error():
    with pytest.raises(ConfigError, match=r"memory\.policy must be one of .*'lru'"):
        MemoryConfig(policy="lru")
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(budget_tokens=0), r"memory\.budget_tokens must be > 0, got 0"),
        (dict(budget_tokens=-5), r"memory\.budget_tokens must be > 0, got -5"),
        (dict(local_window_tokens=0), r"memory\.local_window_tokens must be > 0"),
        (dict(page_tokens=0), r"memory\.page_tokens must be > 0"),
        (dict(max_question_tokens=0), r"memory\.max_question_tokens must be > 0"),
        (dict(offload_bytes=-1), r"memory\.offload_bytes must be >= 0, got -1"),
        (dict(retrieve_frames=-1), r"memory\.retrieve_frames must be >= 0, got -1"),
        (dict(budget_tokens=100, local_window_tokens=100), r"local_window_tokens \(100\) must be smaller than"),
        (dict(budget_tokens=100, local_window_tokens=200), r"local_window_tokens \(200\) must be smaller than"),
    ],
)
def test_memory_config_rejects(fields, match):
    with pytest.raises(ConfigError, match=match):
        MemoryConfig(**fields)


def test_memory_config_accepts_edges():
    MemoryConfig(budget_tokens=2, local_window_tokens=1, offload_bytes=0, retrieve_frames=0, page_tokens=1, max_question_tokens=1)


@pytest.mark.parametrize(
    "fields",
    [
        dict(max_new_tokens=0),
        dict(max_new_tokens=-1),
        dict(max_new_tokens=11, max_new_tokens_limit=10),
        dict(max_new_tokens_limit=0),
    ],
)
def test_generation_config_rejects(fields):
    with pytest.raises(ConfigError, match="max_new_tokens must be in"):
        GenerationConfig(**fields)


def test_generation_config_accepts_edges():
    GenerationConfig(max_new_tokens=1, max_new_tokens_limit=1)
    GenerationConfig(max_new_tokens=10, max_new_tokens_limit=10)


def test_every_hook_of_the_interface_is_used_by_some_policy():
    """Issue 45: ``MemoryPolicy`` small, no hook that no policy overrides (``pending_units`` is read from
    ``open_segment``, not overridden: final)."""
    from videokv_node.memory.policies.base import MemoryPolicy

    hooks = {name for name, value in vars(MemoryPolicy).items()
             if callable(value) and not name.startswith("_") and not getattr(value, "__final__", False)}
    classes = policy_classes().values()
    unused = sorted(h for h in hooks if not any(h in vars(cls) for cls in classes))
    assert not unused, f"hooks no policy overrides: {unused}"
    assert len(hooks) <= 19
