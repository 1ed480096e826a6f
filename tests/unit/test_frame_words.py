"""Words in memory (issue 34): the words a model writes into a frame's tokens (videokv-tiny v5's nouns,
``VideoLLMAdapter.frame_words``) are kept with the frame's block, leave with it, survive snapshots, and put
the blocks that name a ``~/locate`` query's thing on the re-ranking's shortlist (``memory/questions/locate.py``).

The tiny random model writes no words, so its ``frame_words`` is replaced here by a table from each frame's
own tokens to words chosen by the test; the references below are computed from that table by hand."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.helpers import scene as scene_frames
from tests.unit.test_pose_memory import POLICY_CONFIGS, engine, feed
from videokv_node.memory import Frame, Question
from videokv_node.memory.config import MuKVConfig, ReKVConfig
from videokv_node.memory.questions.locate import LocateQuery, Moment, with_named
from videokv_node.memory.store.words import COLOUR_WORDS, SYNONYMS, names, words_shortlist
from videokv_node.memory.snapshot.format import SnapshotError, load_snapshot, save_snapshot


def words_for(i: int) -> tuple[str, ...]:
    """Frame i's words: a dog in every third frame, a car and a dog after it, nothing in the rest."""
    return (("dog",), ("car", "dog"), ())[i % 3]


@pytest.fixture
def worded(tiny_adapter, monkeypatch):
    """Installs a ``frame_words`` on the tiny adapter that gives frame i of the returned frames ``words_for(i)``,
    recognising each frame by its encoded tokens (nearest, as a batch may round differently)."""
    def install(frames: list[Frame]) -> dict[int, tuple[str, ...]]:
        feats = torch.cat([tiny_adapter.encode_frames([f.rgb]) for f in frames]).flatten(1).double()

        def frame_words(got: torch.Tensor) -> list[tuple[str, ...]]:
            nearest = torch.cdist(got.flatten(1).double(), feats).argmin(dim=1)
            return [words_for(int(i)) for i in nearest]

        monkeypatch.setattr(tiny_adapter, "frame_words", frame_words)
        return {f.stamp_ns: words_for(i) for i, f in enumerate(frames)}
    return install


def saved(adapter, frames: list[Frame], tmp_path):
    """A rekv engine fed ``frames`` and saved: (the engine, its manifest's path, the manifest), to edit and load."""
    e = engine(adapter, "rekv")
    feed(e, frames)
    save_snapshot(e, tmp_path / "snap")
    path = tmp_path / "snap" / "manifest.json"
    return e, path, json.loads(path.read_text())


def expected_words(block, by_stamp: dict[int, tuple[str, ...]]) -> tuple[str, ...]:
    out: list[str] = []
    for s in block.stamps_ns:
        out += [w for w in by_stamp.get(s, ()) if w not in out]
    return tuple(out)


@pytest.mark.parametrize("policy", list(POLICY_CONFIGS))
def test_blocks_keep_their_frames_words(tiny_adapter, worded, policy):
    frames = scene_frames(9, 0, 3)
    by_stamp = worded(frames)
    e = engine(tiny_adapter, policy)
    feed(e, frames)
    blocks = [b for b in e.store.blocks() if not (b.kind == "summary" and b.stamp_ns <= 0)]
    assert blocks and any(b.words for b in blocks)
    for b in blocks:
        assert b.words == expected_words(b, by_stamp), (b.kind, b.stamps_ns)
    live = {(b.camera, s) for b in e.store.blocks() for s in b.stamps_ns}
    live |= {(u.camera, s) for u in e.policy.pending_units() for s in (u.stamps_ns or (u.stamp_ns,))}
    newest = max(s for _, s in live)
    assert all(k in live or k[1] > newest for k in e.tables.words)  # the table follows memory
    e.reset()
    assert e.tables.words == {}


@pytest.mark.parametrize("policy", ["rekv", "streamkv", "mukv"])
def test_snapshot_round_trip_keeps_words(tiny_adapter, worded, tmp_path, policy):
    frames = scene_frames(9, 2, 3)
    worded(frames)
    a = engine(tiny_adapter, policy)
    feed(a, frames[:8])
    save_snapshot(a, tmp_path / "snap")
    b = engine(tiny_adapter, policy)
    load_snapshot(b, tmp_path / "snap")
    assert [x.words for x in b.store.blocks()] == [x.words for x in a.store.blocks()]
    assert b.pending_words() == a.pending_words()  # frames waiting (StreamKV's open segment) keep theirs
    feed(a, frames[8:])
    feed(b, frames[8:])  # the same next frame: the same blocks, words included
    assert [x.words for x in b.store.blocks()] == [x.words for x in a.store.blocks()]


def test_a_snapshot_without_words_loads_with_none(tiny_adapter, worded, tmp_path):
    """A snapshot written before words were kept has no ``words`` entries: its blocks load with none."""
    frames = scene_frames(5, 3, 3)
    worded(frames)
    a, path, m = saved(tiny_adapter, frames, tmp_path)
    assert any("words" in entry for entry in m["blocks"])
    for entry in m["blocks"]:
        entry.pop("words", None)
    del m["engine"]["pending_words"]
    path.write_text(json.dumps(m))
    b = engine(tiny_adapter, "rekv")
    load_snapshot(b, tmp_path / "snap")
    assert len(b.store) == len(a.store) and all(x.words == () for x in b.store.blocks())


def test_mukv_segment_words_survive_a_snapshot_while_a_frame_waits(tiny_adapter, worded, tmp_path):
    """Segment blocks only: frame 7 waits in MuKV's own state when the snapshot is taken; its words still
    reach the third segment's block after the restore (``pending_words``)."""
    mukv = MuKVConfig(granularities=("segment",), segment_frames=3, retrieve_patch=0, retrieve_frame=0, retrieve_segment=1)
    frames = scene_frames(9, 6, 3)
    by_stamp = worded(frames)
    a = engine(tiny_adapter, "mukv", mukv=mukv)
    feed(a, frames[:7])
    save_snapshot(a, tmp_path / "snap")
    b = engine(tiny_adapter, "mukv", mukv=mukv)
    load_snapshot(b, tmp_path / "snap")
    feed(b, frames[7:])
    assert len(b.store) == 3
    assert [x.words for x in b.store.blocks()] == [expected_words(x, by_stamp) for x in b.store.blocks()]
    assert list(b.store.blocks())[-1].words == ("dog", "car")  # frames 6, 7, 8: (dog), (car, dog), (): each once


@pytest.mark.parametrize("subject, word, said", [
    ("the dog", "dog", True),
    ("Where did you last see the dogs?", "dog", True),  # plural
    ("the boxes", "box", True),
    ("the red toolbox", "box", False),  # whole words only
    ("the hotdog", "dog", False),
    ("a traffic light", "traffic light", True),  # a word of two
    ("the light", "traffic light", False),
    ("the traffic", "traffic light", False),
    ("my jeans", "jean", True),
    ("THE DOG", "dog", True),
    ("", "dog", False),
    ("the couch", "sofa", True),  # synonyms, either way
    ("Where did you last see the puppies?", "dog", True),
    ("my bike", "bicycle", True),
    ("the bicycle", "bike", True),
    ("the garbage can", "trash can", True),
    ("the can", "trash can", False),
    ("the red toolbox", "tool kit", True),
    ("the kettle", "teapot", False),  # no group: only itself
])
def test_names_are_whole_words_singular_or_plural(subject, word, said):
    assert names(subject, word) is said


@pytest.mark.parametrize("subject, word, said", [
    # the rest alone: a blue circle is a circle, unless the subject gives it another colour
    ("Which colour did the circle have?", "blue circle", True),
    ("What colour were the circles?", "blue circle", True),
    ("the red circle", "blue circle", False),
    ("the blue circle", "blue circle", True),
    ("the big blue circle", "blue circle", True),
    ("Where did you last see the snake?", "green snake", True),  # the noun table's words too
    ("the fox", "red fox", True),
    ("the grey fox", "red fox", False),
    # the colour before a word for any thing, or last
    ("What shape was the green thing?", "green triangle", True),
    ("the green things", "green triangle", True),
    ("a green one", "green triangle", True),
    ("the green object", "green triangle", True),
    ("Which shape was green?", "green triangle", True),
    ("What shape was the green thing?", "blue triangle", False),
    ("Which shape was green?", "red triangle", False),
    # a colour elsewhere names nothing; only a colour in first place counts
    ("the red toolbox", "red square", False),
    ("green paint on the wall", "green triangle", False),
    ("the heron", "little blue heron", False),
    ("the blue thing", "little blue heron", False),
    ("the triangle", "triangle", True),  # a word of one: as before
    ("the gray circle", "grey circle", True),  # one colour, two spellings
    ("the grey thing", "gray circle", True),
])
def test_a_colour_word_is_named_by_its_thing_or_by_its_colour(subject, word, said):
    """The colour rule (memory/store/words.py's module doc), by hand: a frame's "blue circle" is found by a
    question about the circle's colour or the blue thing's shape, never by another colour's thing."""
    assert names(subject, word) is said


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(COLOUR_WORDS)), st.sampled_from(sorted(COLOUR_WORDS)),
       st.sampled_from(["circle", "square", "triangle", "fox", "traffic light"]),
       st.sampled_from(["", "big ", "small "]), st.sampled_from(["the {}", "Where did you see the {}?",
                                                                "What colour was the {} you saw?"]))
def test_a_coloured_thing_is_never_named_by_another_colours_thing(colour, asked, thing, size, wording):
    """For any two colours and a thing: "<asked> <thing>" names the frame word "<colour> <thing>" exactly when the
    colours are the same, the thing alone (any size word before it) always does, and a word of one colour's any-thing
    names it exactly when the colours are the same (grey and gray are one colour)."""
    word = f"{colour} {thing}"
    same = {asked, colour} == {"grey", "gray"} or asked == colour
    assert names(wording.format(f"{size}{asked} {thing}"), word) is same
    assert names(wording.format(f"{size}{thing}"), word)
    assert names(wording.format(f"{asked} thing"), word) is same


def fake_block(i: int, stamp_s: float, words: tuple[str, ...], camera: str = "/cam", span_end_s: float = 0.0):
    """What ``words_shortlist`` reads of a FrameBlock."""
    stamp = round(stamp_s * 1e9)
    return type("B", (), {"block_id": i, "stamp_ns": stamp, "stamps_ns": (stamp,), "camera": camera,
                          "span_end_ns": round(span_end_s * 1e9), "words": words})()


def test_words_shortlist_most_certain_word_first_then_newest():
    """One sighting (frames seconds apart): the most certain word first, then the newest."""
    blocks = [fake_block(1, 10, ("dog",)), fake_block(2, 12, ("cat", "dog")), fake_block(3, 14, ("dog", "cat")),
              fake_block(4, 16, ("cat",)), fake_block(5, 18, ())]
    assert [b.block_id for b in words_shortlist(blocks, "the dog", 5)] == [3, 1, 2]
    assert [b.block_id for b in words_shortlist(blocks, "the dog", 2)] == [3, 1]
    assert [b.block_id for b in words_shortlist(blocks, "the cats", 5)] == [4, 2, 3]
    assert words_shortlist(blocks, "the car", 5) == []


def test_words_shortlist_reads_every_sighting_before_a_second_frame_of_one():
    """A glimpse long ago is not hidden by many newer frames of one later sighting: the shortlist takes the best
    frame of each sighting first (by hand: sightings more than 30 s apart, per camera; a still span's end
    counts as seen)."""
    glimpse = fake_block(1, 100, ("car",))
    later = [fake_block(10 + k, 1000 + 2 * k, ("car",)) for k in range(20)]  # 40 s of one sighting
    other_camera = fake_block(40, 1010, ("car",), camera="/rear")
    still = fake_block(50, 2000, ("truck", "car"), span_end_s=2100)  # a still span to 2100 s
    after_still = fake_block(51, 2120, ("car",))  # 20 s after the span's end: the same sighting
    blocks = [glimpse, *later, other_camera, still, after_still]
    got = [b.block_id for b in words_shortlist(blocks, "the car", 6)]
    # sightings, best block first: [51 (rank 0, 2120 s), 50], [29 (newest of later), 28, ...], [40], [1]
    assert got == [51, 29, 40, 1, 50, 28]
    assert [b.block_id for b in words_shortlist(blocks, "the car", 3)] == [51, 29, 40]
    assert [b.block_id for b in words_shortlist(blocks, "the truck", 6)] == [50]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 600), st.sampled_from(["/a", "/b"]), st.integers(0, 2)), max_size=30),
       st.integers(1, 12))
def test_words_shortlist_covers_each_sighting_once_before_any_twice(frames, limit):
    """For any frames: the shortlist is the named blocks, each once, at most ``limit``; its first entries are one
    block of each sighting (re-derived here: a camera's named frames split where more than 30 s pass), the best
    of it (most certain word, then newest); a sighting gets a second block only once every sighting has one."""
    vocab = [("dog",), ("cat", "dog"), ("cat",)]
    blocks = [fake_block(i, stamp, vocab[w], camera) for i, (stamp, camera, w) in enumerate(frames)]
    named = [b for b in blocks if "dog" in b.words]
    got = words_shortlist(blocks, "the dog", limit)
    assert len(got) == min(limit, len(named)) and len({b.block_id for b in got}) == len(got)
    assert all("dog" in b.words for b in got)
    groups: list[list] = []
    for camera in ("/a", "/b"):
        run = sorted((b for b in named if b.camera == camera), key=lambda b: (b.stamp_ns, b.block_id))
        for k, b in enumerate(run):
            if k == 0 or b.stamp_ns - run[k - 1].stamp_ns > 30e9:
                groups.append([])
            groups[-1].append(b)
    group_of = {b.block_id: g for g, members in enumerate(groups) for b in members}
    head = [group_of[b.block_id] for b in got[:len(groups)]]
    assert len(set(head)) == len(head)  # one per sighting first
    for b in got[:len(groups)]:
        best = min(groups[group_of[b.block_id]], key=lambda c: (c.words.index("dog"), -c.stamp_ns, c.block_id))
        assert b is best


def test_synonym_groups_do_not_overlap():
    """A word in two groups would join them silently: each word belongs to one group at most."""
    seen = [w for g in SYNONYMS for w in g]
    assert len(seen) == len(set(seen))


def test_locate_rereads_the_blocks_whose_words_name_the_thing(tiny_adapter, worded, monkeypatch):
    """rekv's shortlist of 2 (top_k 2) joined by the 2 blocks the words name first: the newest frames whose first
    word is "dog" (frames 9 and 6 of 11). No block names "bicycle": the shortlist is the first ranking's. With
    ``answer.locate_words`` or re-ranking off, words are not read."""
    frames = scene_frames(11, 4, 3)
    worded(frames)
    e = engine(tiny_adapter, "rekv", budget_frames=20)
    feed(e, frames)
    read = []
    real = e.read_alone
    monkeypatch.setattr(e, "read_alone", lambda blocks, text: read.append([b.stamp_ns for b in blocks]) or real(blocks, text))
    e.generation.answer = dataclasses.replace(e.generation.answer, locate_rerank=2)  # a runtime parameter
    got = e.locate(LocateQuery("Where did you last see the dog?", top_k=2))
    assert got.method == "retrieval+words+likelihood" and len(got.moments) == 2
    assert {frames[9].stamp_ns, frames[6].stamp_ns} <= set(read[-1]) and 2 <= len(read[-1]) <= 4
    assert e.locate(LocateQuery("the bicycle", top_k=2)).method == "retrieval+likelihood"
    e.generation.answer = dataclasses.replace(e.generation.answer, locate_words=False)  # answer.locate_words off
    assert e.locate(LocateQuery("the dog", top_k=2)).method == "retrieval+likelihood"
    e.generation.answer = dataclasses.replace(e.generation.answer, locate_rerank=0)
    assert e.locate(LocateQuery("the dog", top_k=2)).method == "retrieval"


@pytest.mark.parametrize("selection", ["shared", "layer"])
def test_rekv_questions_attend_the_blocks_whose_words_they_name(tiny_adapter, worded, selection):
    """memory.rekv.words 0.5 of retrieve_frames 2: one block of the pool (the recent window is frame 10) is the
    newest whose first word the question names, frame 9 ("dog"), attended in every layer; ReKV retrieves the
    other. A question naming no frame's word keeps ReKV's two."""
    frames = scene_frames(11, 5, 3)
    worded(frames)
    e = engine(tiny_adapter, "rekv", budget_frames=20, rekv=ReKVConfig(selection=selection, words=0.5))
    feed(e, frames)
    e.ask(Question("Did you see a dog?", max_new_tokens=1))
    layers = e.last_layer_stamps
    assert all(frames[9].stamp_ns in layer for layer in layers)
    assert all(len(layer) == 3 for layer in layers)  # the window's frame, the named one, one retrieved
    e.ask(Question("Did you see a bicycle?", max_new_tokens=1))
    assert all(len(layer) == 3 for layer in e.last_layer_stamps)


def test_the_word_index_follows_the_store(tiny_adapter, worded):
    """``BlockStore.words`` holds exactly the held blocks' words: after evictions (full, a budget of a few
    frames) and after a reset."""
    frames = scene_frames(12, 7, 3)
    by_stamp = worded(frames)
    e = engine(tiny_adapter, "full", budget_frames=2)
    feed(e, frames)
    assert e.store.evicted_blocks > 0
    for word in ("dog", "car"):
        want = {b.block_id: b.words.index(word) for b in e.store.blocks() if word in b.words}
        assert want and e.store.words.named(f"the {word}") == want
        assert all(word in by_stamp[e.store.index.blocks[e.store.index.slot_of[i]].stamp_ns] for i in want)
    assert e.store.words.named("the bicycle") == {}
    e.reset()
    assert len(e.store.words) == 0


def test_with_named_puts_the_named_moments_first_and_keeps_the_first_rankings_blocks():
    def block(i, stamps):
        return type("B", (), {"block_id": i, "stamp_ns": stamps[0], "stamps_ns": stamps, "camera": "cam", "kind": "frame",
                              "pose_at": lambda self, s: None, "last_stamp": lambda self, s: s})()

    a, b = block(1, (10,)), block(2, (20,))
    moments = [Moment(10, "cam", 0.9), Moment(20, "cam", 0.5)]
    sources = {(10, "cam"): a, (20, "cam"): b}
    x, y = block(3, (30, 40)), block(4, (10,))  # a segment of two frames, and another block citing frame 10
    got = with_named(moments, sources, [x, y])
    assert [m.stamp_ns for m in got] == [40, 30, 10, 20]  # the named first (a block's frames newest first), then the rest
    assert sources[(30, "cam")] is x and sources[(40, "cam")] is x and sources[(10, "cam")] is a


@pytest.mark.parametrize("bad", ["dog", [1], [""], ["dog", "dog"]])
def test_a_snapshot_with_malformed_words_is_refused_and_changes_nothing(tiny_adapter, worded, tmp_path, bad):
    frames = scene_frames(4, 8, 3)
    worded(frames)
    _, path, m = saved(tiny_adapter, frames, tmp_path)
    next(entry for entry in m["blocks"] if "words" in entry)["words"] = bad
    path.write_text(json.dumps(m))
    b = engine(tiny_adapter, "rekv")
    feed(b, frames[:2])
    before = [(x.block_id, x.words) for x in b.store.blocks()]
    with pytest.raises(SnapshotError, match="malformed.*words"):
        load_snapshot(b, tmp_path / "snap")
    assert [(x.block_id, x.words) for x in b.store.blocks()] == before
