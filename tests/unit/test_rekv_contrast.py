"""``memory.rekv.contrast`` (issue 32, ours): each block scored by its mean key less the mean of its w
neighbours on each side in time (same camera and stream). Checked against hand-computed cases, a
list-walking reference written here (hypothesis: evictions, two cameras, any w), and through the
engine: a question's shared selection and ``~/locate``'s first ranking against the fused reference of
test_rekv_shared over key means recomputed from each block's stored keys and contrasted here."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit import references as ref
from tests.unit.helpers import random_frames
from tests.unit.test_policies import GEO, block
from tests.unit.test_rekv_shared import _question_queries, fused_reference
from videokv_node.memory import ConfigError, GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.memory.config import AnswerConfig, ReKVConfig
from videokv_node.memory.questions.locate import LocateQuery


def contrast_reference(blocks, w: int, means: dict[int, torch.Tensor] | None = None) -> dict[int, torch.Tensor]:
    """Per block id: its key_mean less the mean key_mean of the up to w blocks before and w after it among
    ``blocks`` of its camera (and stream), ordered by id; its own key_mean when it has none (float64).
    ``means``: the blocks' mean keys by id, recomputed by the caller, instead of their ``key_mean``."""
    mean = (lambda b: b.key_mean.double()) if means is None else (lambda b: means[b.block_id].double())
    out = {}
    for b in blocks:
        same = sorted((o for o in blocks if (o.camera, o.stream) == (b.camera, b.stream)), key=lambda o: o.block_id)
        i = [o.block_id for o in same].index(b.block_id)
        neigh = same[max(0, i - w):i] + same[i + 1:i + 1 + w]
        km = mean(b)
        out[b.block_id] = km - torch.stack([mean(o) for o in neigh]).mean(0) if neigh else km
    return out


def _store(values: list[float], cameras: list[str] | None = None) -> tuple[BlockStore, list]:
    store = BlockStore(GEO, torch.device("cpu"), offload_bytes=0, page_tokens=4)
    held = []
    for i, v in enumerate(values):
        b = block(i, camera=cameras[i] if cameras else "cam")
        b.key_mean = torch.full((GEO.n_layers, GEO.n_kv_heads, GEO.head_dim), float(v))
        store.add(b)
        held.append(b)
    return store, held


def _contrasted(store: BlockStore, ids: list[int], w: int) -> list[float]:
    slots = torch.tensor([store.index.slot_of[i] for i in ids])
    return [float(x) for x in store.index.contrasted_key_means(slots, w)[0, :, 0, 0]]


def test_contrast_hand_computed():
    """Mean keys 1, 2, 4, 8 in time order. w = 1: 1 - 2, 2 - (1 + 4) / 2, 4 - (2 + 8) / 2, 8 - 4;
    w = 5: every other block is a neighbour; w = 0: the mean keys as held."""
    store, _ = _store([1, 2, 4, 8])
    assert _contrasted(store, [0, 1, 2, 3], 1) == [-1.0, -0.5, -1.0, 4.0]
    assert _contrasted(store, [3, 0], 5) == pytest.approx([8 - 7 / 3, 1 - 14 / 3])
    assert _contrasted(store, [2, 1], 0) == [4.0, 2.0]


def test_contrast_takes_neighbours_of_the_same_camera_only():
    """Cameras interleaved a, b, a, b, a (keys 1, 100, 3, 200, 7): a's middle frame (3) is contrasted
    against 1 and 7, b's first (100) against 200 only."""
    store, _ = _store([1, 100, 3, 200, 7], ["a", "b", "a", "b", "a"])
    assert _contrasted(store, [2, 1, 4], 1) == [3 - 4.0, 100 - 200.0, 7 - 3.0]


def test_a_lone_block_keeps_its_mean_key_and_a_free_slot_is_refused():
    store, held = _store([5, 6])
    store.evict(held[0])
    assert _contrasted(store, [1], 2) == [6.0]
    with pytest.raises(ValueError, match="holds no block"):
        store.index.contrasted_key_means(torch.tensor([store.index.capacity - 1]), 1)
    with pytest.raises(ValueError, match=">= 0"):
        store.index.contrasted_key_means(torch.tensor([store.index.slot_of[1]]), -1)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 25), w=st.integers(0, 6), seed=st.integers(0, 10_000), evict=st.integers(0, 8))
def test_contrast_equals_the_list_walk(n, w, seed, evict):
    """Random keys, two cameras, evictions leaving reused slots; any subset of slots asked, in any order,
    gets the reference's rows (what it is asked with never changes a block's contrast), and the index's
    layer scores (contrasted on the scores) are the reference's contrasted keys scored."""
    rng = random.Random(seed)
    store = BlockStore(GEO, torch.device("cpu"), offload_bytes=0, page_tokens=4)
    held = []
    for i in range(n):
        b = block(i, camera=rng.choice("ab"))
        b.key_mean = torch.tensor([[[rng.uniform(-3, 3) for _ in range(GEO.head_dim)] for _ in range(GEO.n_kv_heads)]
                                   for _ in range(GEO.n_layers)])
        store.add(b)
        held.append(b)
    for b in rng.sample(held, min(evict, n - 1)):
        store.evict(b)
        held.remove(b)
    for extra, b in enumerate(rng.sample(held, min(2, len(held)))):  # a freed slot taken again by a newer block
        store.evict(b)
        held.remove(b)
        b2 = block(n + extra, camera=b.camera)
        b2.key_mean = b.key_mean * 2
        store.add(b2)
        held.append(b2)
    expected = contrast_reference(held, w)
    asked = rng.sample(held, rng.randint(1, len(held)))
    slots = torch.tensor([store.index.slot_of[b.block_id] for b in asked])
    got = store.index.contrasted_key_means(slots, w)
    query = torch.tensor([[[rng.uniform(-1, 1) for _ in range(GEO.head_dim)] for _ in range(GEO.n_kv_heads)]
                          for _ in range(GEO.n_layers)])
    scores = store.index.layer_scores(slots, query, w)  # (L, n): contrasted on the scores, not the keys
    for j, b in enumerate(asked):
        torch.testing.assert_close(got[:, j].double(), expected[b.block_id], atol=1e-5, rtol=1e-5)
        # ReKV's score of the reference's contrasted key: mean over KV heads of q_h . k_h / sqrt(D), per layer
        want = (query.double() * expected[b.block_id]).sum((1, 2)) / (GEO.n_kv_heads * GEO.head_dim ** 0.5)
        torch.testing.assert_close(scores[:, j].double(), want, atol=1e-4, rtol=1e-4)


def test_fused_top_k_ranks_the_contrasted_keys():
    """A bright stretch (9, 9, 9, 9) then a dim one (1, 1, 3, 1, 1) whose third frame shows something (3).
    Raw, the bright stretch fills the top 2 (ties: the newer first): 3, 2. Contrasted (w = 1): 0, 0, 0,
    9 - 5 = 4 (the last before the cut), 1 - 5 = -4, 1 - 2 = -1, 3 - 1 = 2, -1, 0: the cut's frame and
    the frame that differs from its neighbours, 3 and 6."""
    store, _ = _store([9, 9, 9, 9, 1, 1, 3, 1, 1])
    query = torch.ones(GEO.n_layers, GEO.n_kv_heads, GEO.head_dim)

    def best(w):
        return [store.index.blocks[s].block_id for s in store.index.fused_top_k(query, store.index.candidate_mask(), 2, w).tolist()]
    assert best(0) == [3, 2]
    assert best(1) == [3, 6]
    assert _contrasted(store, [3, 4, 5, 6], 1) == [4.0, -4.0, -1.0, 2.0]


@pytest.mark.parametrize("w", [1, 3])
def test_shared_selection_and_locate_rank_by_the_contrasted_keys(tiny_adapter64, w):
    """Through the engine: the question's shared top-k and ~/locate's first ranking (re-ranking off) equal
    the fused reference over plain-forward queries and key means recomputed from each block's stored keys,
    contrasted by the reference above."""
    a = tiny_adapter64
    cfg = MemoryConfig(policy="rekv", local_window_tokens=50_000, retrieve_frames=3, budget_tokens=100_000, page_tokens=1,
                       rekv=ReKVConfig(selection="shared", question_window=False, contrast=w))
    engine = VideoMemoryEngine(a, cfg, GenerationConfig(max_new_tokens=1, answer=AnswerConfig(locate_rerank=0)))
    for f in random_frames(9, seed=7):
        engine.ingest([f])
    blocks = list(engine.store.blocks())
    means = {}
    for b in blocks:  # the reference's own mean keys: stored keys rotated back to no position by its own RoPE
        means[b.block_id] = torch.stack([ref.pre_rope_key_mean(a, b.layers[l].keys, b.positions[0]) for l in range(a.geometry.n_layers)])
        torch.testing.assert_close(means[b.block_id].float(), b.key_mean, atol=1e-4, rtol=1e-4)
    contrasted = contrast_reference(blocks, w, means)
    ids = [b.block_id for b in blocks]
    text = "a red ball"
    q = _question_queries(a, text)
    engine.ask(Question(text, max_new_tokens=1))
    expected = fused_reference(q, [contrasted[i].float() for i in ids], ids, 3)
    assert engine.last_layer_blocks == [expected] * a.geometry.n_layers
    moments = engine.locate(LocateQuery(text, top_k=len(ids))).moments
    best_first = fused_reference(q, [contrasted[i].float() for i in ids], ids, len(ids), ordered=True)
    stamp_of = {b.block_id: b.stamp_ns for b in blocks}
    assert [m.stamp_ns for m in moments] == [stamp_of[i] for i in best_first]
    engine.close()


def test_contrast_is_checked_and_off_in_the_paper_preset():
    from videokv_node.memory.records.presets import preset_memory_config

    with pytest.raises(ConfigError, match="memory.rekv.contrast"):
        ReKVConfig(contrast=-1)
    assert preset_memory_config("paper", "rekv").rekv.contrast == 0
