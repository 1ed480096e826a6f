"""The needle-stream generator (``eval/needles.py``): seeded, well-formed, one right answer per question."""

from __future__ import annotations

import json

import pytest

from videokv_node.eval import needles
from videokv_node.eval.needles import make_stream, make_streams, write_streams
from videokv_node.eval.text_frames import load_text_frames

import random


def test_the_same_seed_gives_the_same_streams_and_another_seed_others():
    assert make_streams(3, 20, seed=5) == make_streams(3, 20, seed=5)
    assert make_streams(3, 20, seed=5) != make_streams(3, 20, seed=6)


@pytest.mark.parametrize("seed", range(20))
def test_every_question_has_one_answer_stated_early_in_the_stream(seed):
    stream = make_stream("s", 20, random.Random(seed))
    stamps = [t for t, _ in stream.frames]
    texts = dict(stream.frames)
    assert stamps == sorted(set(stamps))
    assert [q.question_type for q in stream.questions] == ["single_fact"] * 5 + ["two_facts", "order", "order"]
    for q in stream.questions:
        assert len(q.choices) == 4 and len(set(q.choices)) == 4
        right = q.choices[q.answer]
        evidence = [texts[s] for s in q.evidence_stamps]
        assert all(s <= stream.duration / 2 for s in q.evidence_stamps)  # needles in the first half
        # The right answer is stated in its needle frames, no wrong one anywhere in the stream.
        assert any(right in e for e in evidence)
        for i, c in enumerate(q.choices):
            if i != q.answer and q.question_type != "order":
                assert not any(c in t for t in texts.values()), (c, q)
    for order, seen in zip(stream.questions[6:], (0, 1)):
        sightings = [texts[s] for s in order.evidence_stamps]
        assert order.evidence_stamps[0] < order.evidence_stamps[1]
        assert order.choices[order.answer] in sightings[seen]
        assert any(c in sightings[1 - seen] for c in order.choices)  # the other sighting is a choice: order, not presence
    container_frame, room_frame = (texts[s] for s in stream.questions[5].evidence_stamps)
    assert "inside the" in container_frame and "is in the" in room_frame
    # The subject (~/locate's query for the question) names what its first evidence frame states, and no
    # distractor (a container is named by two needles: the object in it, it in a room); order questions have none.
    for q in stream.questions:
        if q.question_type == "order":
            assert q.subject == ""
            continue
        thing = q.subject.removeprefix("the ")
        assert q.subject.startswith("the ") and thing in q.question and thing in texts[q.evidence_stamps[0]]
        naming = [s for s, t in texts.items() if thing in t]
        assert q.evidence_stamps[0] in naming and len(naming) <= 2 and max(naming) <= stream.duration / 2


def test_distractors_never_name_a_needle_word():
    words = needles.OBJECTS + needles.PLACES + needles.CONTAINERS + needles.ROOMS + needles.ANIMALS
    rng = random.Random(0)
    for _ in range(500):
        text = needles._distractor(rng)
        assert not any(w in text for w in words), text


def test_written_files_are_the_annotation_schema_and_readable_streams(tmp_path):
    streams = make_streams(2, 12, seed=1)
    paths, questions = write_streams(streams, tmp_path)
    assert [p.name for p in paths] == ["needles-000.jsonl", "needles-001.jsonl"]
    frames = load_text_frames(paths[0])
    assert [(f.stamp_s, f.text) for f in frames] == list(streams[0].frames)
    data = json.loads(questions.read_text())
    assert [v["video_id"] for v in data] == ["needles-000", "needles-001"]
    conv = data[0]["conversations"][0]
    assert set(conv) >= {"question", "choices", "answer", "end_time", "question_type"}
    assert conv["answer"] in "ABCD" and conv["end_time"] == data[0]["duration"] == streams[0].duration


def test_too_short_a_stream_is_refused():
    with pytest.raises(ValueError, match="at least 7 frames"):
        make_stream("s", 6, random.Random(0))
