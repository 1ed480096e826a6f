"""Snapshots: a memory saved and loaded answers exactly as the memory it was saved from.

The reference is the engine the snapshot was taken from: for every policy, a fresh engine
loading the snapshot holds bit-identical blocks, answers the same (text, option scores,
evidence), and, fed the same frames afterwards, stays identical (the policy's own state was
restored, not only the blocks). Every refusal leaves the engine as it was.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest
import torch
from safetensors import safe_open

from tests.unit.helpers import scene as scene_frames
from videokv_node.memory import Frame, GenerationConfig, MemoryConfig, Question, VideoMemoryEngine
from videokv_node.memory.snapshot import format as snapshot_mod
from videokv_node.memory.snapshot import files as snapshot_files
from videokv_node.memory.store.block import Tier
from videokv_node.memory.config import HermesConfig, MuKVConfig, StreamKVConfig
from videokv_node.memory.snapshot.format import SNAPSHOT_VERSION, SnapshotError, load_snapshot, resolve_snapshot_path, save_snapshot

POLICY_CONFIGS = {
    "full": {},
    "rekv": {},
    "streamkv": dict(streamkv=StreamKVConfig(similarity_threshold=0.9, min_segment_frames=2, max_segment_frames=3, retrieve_frames=3)),
    "hermes": dict(hermes=HermesConfig(chunk_frames=2, reindex_at=0.005)),
    "mukv": dict(mukv=MuKVConfig(retrieve_patch=3, retrieve_frame=2, retrieve_segment=1)),
}
OPEN = Question("what is there?", max_new_tokens=3)
CHOICE = Question("which colour?", options=["red", "green", "blue"])


def scene(n: int, seed: int = 0, scene_len: int = 5) -> list[Frame]:
    """Scenes of near-identical frames, so StreamKV's segmenter sees boundaries (and merges inside)."""
    return scene_frames(n, seed, scene_len)


def engine(adapter, policy: str, budget_frames: int = 2, offload_frames: int = 3, window_frames: int = 1, **over):
    T, L = adapter.tokens_per_frame, adapter.geometry.n_layers
    sink = len(adapter.prefix_ids())
    page_bytes = 4 * adapter.geometry.bytes_per_token // L
    cfg = dict(
        policy=policy,
        budget_tokens=sink + (window_frames + 1 + budget_frames) * T,
        local_window_tokens=window_frames * T,
        offload_bytes=offload_frames * L * (T // 4) * page_bytes,
        page_tokens=4,
        retrieve_frames=2,
    )
    cfg.update(POLICY_CONFIGS[policy])
    cfg.update(over)
    return VideoMemoryEngine(adapter, MemoryConfig(**cfg), GenerationConfig(max_new_tokens=3, max_new_tokens_limit=4))


def feed(e: VideoMemoryEngine, frames: list[Frame]) -> None:
    for f in frames:
        e.ingest([f])


def stats(e: VideoMemoryEngine):
    return dataclasses.replace(e.stats(), ingest_ms_p50=0.0, ingest_ms_p95=0.0)


def memory_of(e: VideoMemoryEngine) -> dict:
    """Everything a snapshot must carry over, comparable with ==: blocks, tiers, counters, policy state."""
    blocks = [
        (b.block_id, b.tier, b.camera, b.stamps_ns, b.kind, b.stream, b.rank, b.protected,
         tuple(None if kv is None else (tuple(kv.index.tolist()), tuple(kv.logical.flatten().tolist())) for kv in b.layers))
        for b in e.store.blocks()
    ]
    policy_state = e.policy.state_dict()
    meta, tensors = policy_state["meta"], policy_state["tensors"]
    return dict(
        blocks=blocks,
        stats=stats(e),
        counters=(e.next_block_id, e.frames_ingested, e.store.evicted_blocks, e.store.evicted_entries,
                  e.store.resident_entries, e.store.offloaded_entries),
        policy=json.dumps(meta, sort_keys=True),
        policy_tensors={k: (t.dtype, tuple(t.shape), t.cpu().flatten().tolist()) for k, t in tensors.items()},
    )


def assert_same_kv(a: VideoMemoryEngine, b: VideoMemoryEngine) -> None:
    for x, y in zip(a.store.blocks(), b.store.blocks(), strict=True):
        assert torch.equal(x.positions, y.positions) and torch.equal(x.key_mean, y.key_mean)
        assert (x.rep is None) == (y.rep is None) and (x.rep is None or torch.equal(x.rep, y.rep))
        for layer, kv in enumerate(x.layers):
            if kv is not None:
                for s, t in zip(a.store.layer_kv(x, layer), b.store.layer_kv(y, layer)):
                    assert s.dtype == t.dtype and torch.equal(s, t)


def answers(e: VideoMemoryEngine):
    out = []
    for q in (OPEN, CHOICE):
        a = e.ask(q)
        out.append((a.text, a.option_index, a.option_scores, [(v.stamp_ns, v.camera) for v in a.evidence], a.n_context_tokens))
    return out


def check_nontrivial(e: VideoMemoryEngine) -> None:
    """The snapshot is taken where each policy's state is not trivial."""
    p, s = e.policy, e.stats()
    assert e.store.evicted_entries > 0 and (s.frames_evicted > 0 or p.name == "hermes")  # HERMES evicts tokens
    if p.uses_offload:
        assert s.bytes_offloaded > 0
    if p.name == "streamkv":
        pending = p.segmenter.pending
        assert len(pending) >= 2 and any(m.weight > 1 for m in pending)  # an open segment with a merged member
    if p.name == "hermes":
        assert p.compressions > 0 and p.reindexed > 0 and p.summary in e.store and any(p._summary_count)
    if p.name == "mukv":
        assert 0 < len(p._segment) < p.cfg.segment_frames


# --- the same answers, then the same future --------------------------------------------
@pytest.mark.parametrize("policy", sorted(POLICY_CONFIGS))
def test_restored_memory_answers_and_continues_like_the_original(tiny_adapter, tmp_path, policy):
    frames = scene(20)
    a = engine(tiny_adapter, policy)
    feed(a, frames[:14])
    check_nontrivial(a)
    info = save_snapshot(a, tmp_path / "snap")
    assert (info.blocks, info.frames_ingested, info.policy) == (len(a.store), 14, policy)
    assert info.fingerprint == tiny_adapter.fingerprint() and info.bytes == sum(f.stat().st_size for f in info.path.iterdir())
    before = memory_of(a)

    b = engine(tiny_adapter, policy)
    loaded = load_snapshot(b, tmp_path / "snap")
    assert loaded.blocks == len(a.store) and loaded.frames_ingested == 14
    assert memory_of(b) == before
    assert_same_kv(a, b)
    assert answers(b) == answers(a)

    feed(a, frames[14:])
    feed(b, frames[14:])
    assert memory_of(b) == memory_of(a)
    assert_same_kv(a, b)
    assert answers(b) == answers(a)


def test_restored_memory_on_mrope(tiny_qwen, tmp_path):
    """Qwen2.5-VL: 3-row positions, StreamKV with an open segment and offloaded blocks."""
    frames = scene(18, seed=1)
    a = engine(tiny_qwen, "streamkv")
    feed(a, frames[:14])
    save_snapshot(a, tmp_path / "q")
    b = engine(tiny_qwen, "streamkv")
    load_snapshot(b, tmp_path / "q")
    assert memory_of(b) == memory_of(a) and answers(b) == answers(a)
    feed(a, frames[14:])
    feed(b, frames[14:])
    assert memory_of(b) == memory_of(a) and answers(b) == answers(a)


def test_bfloat16_kv_is_saved_as_bfloat16_and_restored_exactly(tmp_path):
    from videokv_node.models.llava_onevision import LlavaOnevisionAdapter

    base = LlavaOnevisionAdapter.tiny(seed=0)
    bf16 = LlavaOnevisionAdapter(base.model.to(torch.bfloat16), base.tokenizer, name="tiny-bf16")
    a = engine(bf16, "rekv")
    feed(a, scene(8))
    save_snapshot(a, tmp_path / "bf")
    (seg,) = (tmp_path / "bf").glob("seg-*.safetensors")
    with safe_open(seg, "pt") as f:
        assert f.get_slice("layers/0/keys").get_dtype() == "BF16"
    b = engine(bf16, "rekv")
    load_snapshot(b, tmp_path / "bf")
    assert_same_kv(a, b)
    assert memory_of(b) == memory_of(a)


def test_an_empty_memory_round_trips(tiny_adapter, tmp_path):
    a = engine(tiny_adapter, "rekv")
    save_snapshot(a, tmp_path / "empty")
    b = engine(tiny_adapter, "rekv")
    feed(b, scene(3))
    load_snapshot(b, tmp_path / "empty")
    assert memory_of(b) == memory_of(a) and len(b.store) == 0


def test_paths_may_be_strings(tiny_adapter, tmp_path):
    a = engine(tiny_adapter, "full")
    feed(a, scene(3))
    assert save_snapshot(a, str(tmp_path / "w")).path == tmp_path / "w"
    b = engine(tiny_adapter, "full")
    assert load_snapshot(b, str(tmp_path / "w")).blocks == 3 and b.stats().frames_in_memory == 3  # stats refreshed


@pytest.mark.parametrize("policy", sorted(POLICY_CONFIGS))
def test_the_state_dict_alone_carries_the_memory(tiny_adapter, policy):
    """``load_state_dict(state_dict())`` without files: what a snapshot carries is the state dict's."""
    a = engine(tiny_adapter, policy)
    feed(a, scene(14))
    b = engine(tiny_adapter, policy)
    b.load_state_dict(a.state_dict())
    assert memory_of(b) == memory_of(a)
    assert_same_kv(a, b)
    assert answers(b) == answers(a)


# --- a smaller memory than the snapshot's ---------------------------------------------------
@pytest.mark.parametrize("policy", ["rekv", "streamkv"])
@pytest.mark.parametrize("budget_frames, offload_frames", [(1, 2), (5, 2), (5, 1), (1, 12)])
def test_restoring_into_smaller_caps_equals_streaming_under_them(tiny_adapter, tmp_path, policy, budget_frames, offload_frames):
    """ReKV and StreamKV encode the same KV whatever the caps (the window decides), so a big
    snapshot restored under smaller caps (budget, arena or both) must equal the stream run
    under them: same blocks and tiers, same eviction counts, same answers."""
    frames = scene(16, seed=2)
    big = engine(tiny_adapter, policy, budget_frames=5, offload_frames=12)
    feed(big, frames)
    save_snapshot(big, tmp_path / "big")
    small = engine(tiny_adapter, policy, budget_frames=budget_frames, offload_frames=offload_frames)
    load_snapshot(small, tmp_path / "big")
    reference = engine(tiny_adapter, policy, budget_frames=budget_frames, offload_frames=offload_frames)
    feed(reference, frames)
    assert memory_of(small) != memory_of(big)
    assert memory_of(small) == memory_of(reference)
    assert answers(small) == answers(reference)
    L = tiny_adapter.geometry.n_layers
    assert small.store.resident_entries + small.sink.n_tokens * L <= small.config.budget_tokens * L
    assert small.stats().bytes_offloaded <= small.stats().budget_offload_bytes


def test_restoring_with_no_arena_evicts_the_offloaded_blocks(tiny_adapter, tmp_path):
    big = engine(tiny_adapter, "rekv", offload_frames=6)
    feed(big, scene(12))
    save_snapshot(big, tmp_path / "s")
    offloaded = sum(1 for _ in big.store.blocks(Tier.OFFLOADED))
    none = engine(tiny_adapter, "rekv", offload_bytes=0)
    load_snapshot(none, tmp_path / "s")
    assert none.store.arena is None and none.store.offloaded_entries == 0
    assert none.stats().frames_evicted == big.stats().frames_evicted + offloaded
    assert [b.block_id for b in none.store.blocks()] == [b.block_id for b in big.store.blocks(Tier.RESIDENT)]


def test_hermes_restored_under_a_smaller_budget_compresses_to_it(tiny_adapter, tmp_path):
    big = engine(tiny_adapter, "hermes", budget_frames=4)
    feed(big, scene(12))
    save_snapshot(big, tmp_path / "h")
    small = engine(tiny_adapter, "hermes", budget_frames=2)
    load_snapshot(small, tmp_path / "h")
    budget = small.config.budget_tokens - small.sink.n_tokens
    for layer in range(tiny_adapter.geometry.n_layers):
        assert sum(b.layer_tokens(layer) for b in small.store.blocks()) <= budget
    assert small.policy.compressions == big.policy.compressions + 1
    assert small.store.evicted_entries > big.store.evicted_entries
    small.ask(OPEN)


# --- refusals change nothing ---------------------------------------------------------------
@pytest.fixture(scope="module")
def saved(tiny_adapter, tmp_path_factory):
    """A StreamKV snapshot with an open segment, and its directory."""
    root = tmp_path_factory.mktemp("snapshots")
    a = engine(tiny_adapter, "streamkv")
    feed(a, scene(14))
    save_snapshot(a, root / "good")
    return root


@pytest.fixture
def victim(tiny_adapter):
    """A non-empty engine whose memory must survive every refused load."""
    e = engine(tiny_adapter, "streamkv")
    feed(e, scene(7, seed=9))
    return e


def refuse(e: VideoMemoryEngine, path, match: str) -> None:
    before = memory_of(e)
    with pytest.raises(SnapshotError, match=match):
        load_snapshot(e, path)
    assert memory_of(e) == before


def edited(saved, tmp_path, edit) -> object:
    path = tmp_path / "edited"
    shutil.copytree(saved / "good", path)
    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest)
    (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def test_a_snapshot_of_another_model_is_refused(saved, tmp_path):
    from videokv_node.models.llava_onevision import LlavaOnevisionAdapter

    other = LlavaOnevisionAdapter.tiny(seed=1)
    e = engine(other, "streamkv")
    feed(e, scene(5))
    refuse(e, saved / "good", f"fingerprint .*{other.fingerprint()}")


def test_a_snapshot_of_another_policy_is_refused(tiny_adapter, saved):
    e = engine(tiny_adapter, "rekv")
    feed(e, scene(5))
    refuse(e, saved / "good", "holds a 'streamkv' memory; memory.policy is 'rekv'")


def set_block0_tokens(m):
    m["blocks"][0]["n_tokens"] += 1


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda m: m.update(version=SNAPSHOT_VERSION + 1), f"version {SNAPSHOT_VERSION + 1}.*reads versions 1, 2"),
        (lambda m: m["model"].update(fingerprint="0123"), "fingerprint 0123"),
        (lambda m: m["model"]["geometry"].update(dtype="bfloat16"), "geometry"),
        (lambda m: m["model"].update(tokens_per_frame=196), "tokens_per_frame is 196 in the snapshot, 16 now"),
        (lambda m: m["model"]["sink_ids"].__setitem__(3, 7), "prompt sink differs from token 3"),
        (lambda m: m.update(format="something else"), "not a videokv memory snapshot"),
        # The first block listed (its id depends on what the caps evicted first).
        (set_block0_tokens, r"malformed: block \d+: 17 tokens in the manifest, 16 in its segment"),
        (lambda m: m["engine"].pop("next_block_id"), "malformed: missing 'next_block_id'"),
        (lambda m: m["policy_state"]["frames"].pop(), "policy's state does not fit"),
    ],
)
def test_an_incompatible_or_malformed_manifest_is_refused(victim, saved, tmp_path, edit, match):
    refuse(victim, edited(saved, tmp_path, edit), match)


def test_a_policy_state_the_config_cannot_hold_is_refused(tiny_adapter, saved):
    """The open segment has 3 members; an engine allowing 2 refuses it, its store untouched."""
    e = engine(tiny_adapter, "streamkv", streamkv=StreamKVConfig(similarity_threshold=0.9, min_segment_frames=2, max_segment_frames=2))
    feed(e, scene(6))
    refuse(e, saved / "good", "max_segment_frames")


def test_damaged_files_are_refused(victim, saved, tmp_path):
    """The manifest and the state file refuse; a damaged segment costs only its blocks (test_snapshot_degraded.py)."""
    path = tmp_path / "bad"
    shutil.copytree(saved / "good", path)
    state = path / "state.safetensors"
    state.write_bytes(state.read_bytes()[:-3])
    refuse(victim, path, "state.safetensors is corrupt")
    shutil.copy(saved / "good" / "state.safetensors", state)
    text = (path / "manifest.json").read_text()
    (path / "manifest.json").write_text(text[: len(text) // 2])
    refuse(victim, path, "not valid JSON")
    (path / "manifest.json").unlink()
    refuse(victim, path, "not a snapshot")
    refuse(victim, tmp_path / "nothing", "no snapshot")


# --- paths ---------------------------------------------------------------------------------
def test_names_and_paths_resolve_inside_the_root(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    assert resolve_snapshot_path(root, name="day-1_a.b") == root.resolve() / "day-1_a.b"
    assert resolve_snapshot_path(str(root), path="sub/x") == root.resolve() / "sub" / "x"
    assert resolve_snapshot_path(root, path=str(root / "abs")) == root.resolve() / "abs"
    assert resolve_snapshot_path(root, path="a/../b") == root.resolve() / "b"
    (tmp_path / "outside").mkdir()
    (root / "link").symlink_to(root / "sub2", target_is_directory=True)  # a link that stays inside is fine
    assert resolve_snapshot_path(root, path="link/x") == root.resolve() / "sub2" / "x"


@pytest.mark.parametrize(
    "name, path, match",
    [
        ("", "../x", "not inside memory.snapshot_dir"),
        ("", "/tmp/elsewhere", "not inside memory.snapshot_dir"),
        ("", ".", "not inside memory.snapshot_dir"),
        ("", "escape/x", "not inside memory.snapshot_dir"),
        ("", "escape", "not inside memory.snapshot_dir"),
        ("a", "b", "exactly one"),
        ("", "", "exactly one"),
        ("../x", "", "not a plain name"),
        ("a/b", "", "not a plain name"),
        (".hidden", "", "not a plain name"),
        ("..", "", "not a plain name"),
        ("a b", "", "not a plain name"),
        ("", "a\x00b", "cannot be resolved"),
    ],
)
def test_paths_outside_the_root_and_bad_names_are_refused(tmp_path, name, path, match):
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "outside").mkdir()
    (root / "escape").symlink_to(tmp_path / "outside", target_is_directory=True)
    with pytest.raises(SnapshotError, match=match):
        resolve_snapshot_path(root, name=name, path=path)


def test_an_empty_root_disables_snapshots():
    with pytest.raises(SnapshotError, match="snapshots are disabled: memory.snapshot_dir is empty"):
        resolve_snapshot_path("", name="x")


# --- atomic writes -------------------------------------------------------------------------
def test_a_failed_save_leaves_the_previous_snapshot_and_no_temporary(tiny_adapter, tmp_path, monkeypatch):
    a = engine(tiny_adapter, "rekv")
    feed(a, scene(6))
    save_snapshot(a, tmp_path / "s")
    old = (tmp_path / "s" / "manifest.json").read_text()
    feed(a, scene(3, seed=5))

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(snapshot_mod, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        save_snapshot(a, tmp_path / "s")
    monkeypatch.undo()
    real_rename = os.rename

    def rename(src, dst):  # the new snapshot cannot be renamed in: the old one must be put back
        if ".tmp-" in str(src):
            raise OSError("rename failed")
        real_rename(src, dst)

    monkeypatch.setattr(snapshot_files.os, "rename", rename)
    with pytest.raises(OSError, match="rename failed"):
        save_snapshot(a, tmp_path / "s")
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]
    assert (tmp_path / "s" / "manifest.json").read_text() == old
    b = engine(tiny_adapter, "rekv")
    assert load_snapshot(b, tmp_path / "s").frames_ingested == 6


def test_an_interrupted_replacement_is_reported_and_cleaned_by_the_next_save(tiny_adapter, tmp_path):
    a = engine(tiny_adapter, "full")
    feed(a, scene(3))
    save_snapshot(a, tmp_path / "s")
    os.rename(tmp_path / "s", tmp_path / ".s.old-0123abcd")  # a crash between the two renames
    shutil.copytree(tmp_path / ".s.old-0123abcd", tmp_path / ".s.tmp-89abcdef")  # the new one, complete
    (tmp_path / ".s.tmp-00000000").mkdir()  # an earlier crash, before its manifest: not offered
    with pytest.raises(SnapshotError, match=r"no snapshot \(a save was interrupted: .s.old-0123abcd, .s.tmp-89abcdef in"):
        load_snapshot(engine(tiny_adapter, "full"), tmp_path / "s")
    save_snapshot(a, tmp_path / "s")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s"]


def test_a_save_never_replaces_something_that_is_not_a_snapshot(tiny_adapter, tmp_path):
    a = engine(tiny_adapter, "full")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "keep.txt").write_text("mine")
    with pytest.raises(SnapshotError, match="not a snapshot directory"):
        save_snapshot(a, tmp_path / "notes")
    assert (tmp_path / "notes" / "keep.txt").read_text() == "mine"


def test_hermes_script_rule_restored_mid_chunk_continues_like_the_original(tiny_adapter, tmp_path):
    """HERMES' script budget rule (paper preset): restored in the middle of a chunk, the memory is not
    compressed early (the stream would compress at the chunk's end) and continues bit for bit."""
    T = tiny_adapter.tokens_per_frame
    over = dict(budget_tokens=3 * T, hermes=HermesConfig(chunk_frames=3, budget_rule="script", recency="token", reindex_at=0.005))
    frames = scene(14)
    a = engine(tiny_adapter, "hermes", **over)
    feed(a, frames[:8])  # compressions at frames 6 (and not yet at 9): 8 is mid-chunk, above kv_size
    assert a.policy.compressions >= 1 and a.policy._frames % 3 != 0
    save_snapshot(a, tmp_path / "snap")
    b = engine(tiny_adapter, "hermes", **over)
    load_snapshot(b, tmp_path / "snap")
    assert b.policy.compressions == a.policy.compressions and memory_of(b) == memory_of(a)
    assert answers(b) == answers(a)
    feed(a, frames[8:])
    feed(b, frames[8:])
    assert memory_of(b) == memory_of(a)
    assert_same_kv(a, b)
    assert answers(b) == answers(a)
