"""The question file schema (ReKV/StreamKV): answers resolved to option indices, bad files named by entry."""

from __future__ import annotations

import json

import pytest

from videokv_node.eval.questions import (
    EvalQuestion,
    QuestionFileError,
    load_questions,
    parse_questions,
    select_video,
    strip_choice_prefixes,
)


def video(vid="v", **conv):
    base = {"question": "What colour?", "choices": ["red", "green", "blue"], "answer": "B", "end_time": 3.0}
    base.update(conv)
    return {"video_id": vid, "duration": 10, "conversations": [base]}


@pytest.mark.parametrize("answer, index", [
    ("B", 1), ("(B)", 1), ("B.", 1), ("b", None), ("green", 1), ("Green", 1), ("B. green", 1), (" C ", 2),
])
def test_answer_letter_or_text_gives_the_option_index(answer, index):
    q = EvalQuestion("q", ("red", "green", "blue"), answer, 1.0)
    assert q.answer_index() == index


def test_open_question_has_no_index():
    assert EvalQuestion("Describe it.", (), "a red box", 2.0).answer_index() is None


def test_prefixed_choices_are_stripped_only_when_lettered_in_order():
    assert strip_choice_prefixes(["A. red", "B) green", "(C) blue"]) == ["red", "green", "blue"]
    assert strip_choice_prefixes(["B. red", "A. green"]) == ["B. red", "A. green"]  # not A, B, ...: kept
    assert strip_choice_prefixes(["A. red", "green"]) == ["A. red", "green"]


def test_load_sorts_by_end_time_and_keeps_fields(tmp_path):
    data = [{"video_id": "clip", "duration": 30, "conversations": [
        {"question": "late", "answer": "yes", "end_time": 20, "question_type": "open"},
        {"question": "early", "choices": ["A. a", "B. b"], "answer": 0, "end_time": 5.5, "start_time": 1},
    ]}]
    path = tmp_path / "q.json"
    path.write_text(json.dumps(data))
    (v,) = load_questions(path)
    assert v.video_id == "clip" and v.duration == 30.0
    assert [q.question for q in v.questions] == ["early", "late"]
    early = v.questions[0]
    assert early.choices == ("a", "b") and early.answer == "A" and early.answer_index() == 0
    assert early.start_time == 1.0 and v.questions[1].question_type == "open"


@pytest.mark.parametrize("conv, words", [
    ({"end_time": None}, "'end_time' is missing"),
    ({"end_time": -1}, "'end_time' must be a number"),
    ({"end_time": "5"}, "'end_time' must be a number"),
    ({"answer": "D"}, "neither an option letter nor the text"),
    ({"answer": "purple"}, "neither an option letter nor the text"),
    ({"choices": ["only"]}, "2 to 26 choices"),
    ({"choices": ["a", ""]}, "non-empty strings"),
    ({"question": " "}, "'question' must be a non-empty string"),
    ({"start_time": 9.0}, "start_time 9.0 is after end_time 3.0"),
])
def test_malformed_conversations_are_named(conv, words):
    data = [video("ok"), video("bad", **conv)]
    with pytest.raises(QuestionFileError) as err:
        parse_questions(data, "f.json")
    assert "videos[1] (bad).conversations[0]" in str(err.value) and words in str(err.value)


@pytest.mark.parametrize("data, words", [
    ({"video_id": "x"}, "expected a JSON list"),
    ([{"conversations": []}], "'video_id' must be"),
    ([{"video_id": "x"}], "'conversations' must be a list"),
    ([video("x"), video("x")], "appears twice"),
])
def test_malformed_files_are_named(data, words):
    with pytest.raises(QuestionFileError, match=words):
        parse_questions(data)


def test_unreadable_and_non_json_files(tmp_path):
    with pytest.raises(QuestionFileError, match="cannot read"):
        load_questions(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("[{")
    with pytest.raises(QuestionFileError, match="not JSON"):
        load_questions(tmp_path / "bad.json")


def test_select_video_by_name_or_the_only_entry():
    videos = parse_questions([video("a"), video("b")])
    assert select_video(videos, "b").video_id == "b"
    with pytest.raises(QuestionFileError, match="no video_id 'c'.*'a', 'b'"):
        select_video(videos, "c")
    assert select_video(parse_questions([video("only")]), "anything").video_id == "only"
