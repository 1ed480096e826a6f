"""The question files of streaming video QA: ReKV's and StreamKV's annotation schema.

A JSON list of videos, each ``{video_id, duration?, conversations: [...]}``; a
conversation is ``{question, choices?, answer, end_time, start_time?, question_type?,
evidence_stamps?, time_spans?}`` (``evidence_stamps``: the ground-truth frames' times, for needle
recall; ``time_spans``: ``[[start, end], ...]``, when what is asked about was in view, for
temporal grounding, eval/grounding.py).
``end_time`` (seconds from the start of the stream) is when the question is asked;
``choices`` make it multiple-choice, and its ``answer`` is then an option letter
("B", "(B)", "B.") or the text of an option (with or without its "B. " prefix).

Invariants of what ``load_questions`` returns: every ``end_time`` is a finite
number >= 0 (>= ``start_time`` when given); every multiple-choice answer names
exactly one of its choices (``answer_index`` is not None); choices carry no
letter prefix (the model's prompt adds its own letters). A malformed file raises
``QuestionFileError`` naming the entry (``videos[2].conversations[5]``) and what
is wrong, before any work is done.
"""

from __future__ import annotations

import json
import math
import re
import string
from dataclasses import dataclass, field
from pathlib import Path

LETTERS = string.ascii_uppercase
# "A. red", "A) red", "(A) red", "A: red": the prefixes StreamingBench, MVBench and ReKV's files use.
_PREFIX = re.compile(r"^\s*\(?([A-Z])[.):]\s*")
_LETTER = re.compile(r"^\s*\(?([A-Z])\)?[.):]?\s*$")


class QuestionFileError(ValueError):
    """A question file that cannot be evaluated; the message names the entry and the problem."""


@dataclass(frozen=True, slots=True)
class EvalQuestion:
    question: str  # the text asked
    choices: tuple[str, ...]  # options without letter prefixes; empty: an open question
    answer: str  # as in the file: an option letter or text, or the expected open answer
    end_time: float  # seconds from the stream's start at which the question is asked
    start_time: float | None = None  # start of the span the question is about (informational)
    question_type: str = ""  # category for per-type accuracy ("" when the file has none)
    evidence_stamps: tuple[float, ...] = ()  # ground truth: stream times (s) of the frames holding the answer (eval/recall.py)
    time_spans: tuple[tuple[float, float], ...] = ()  # ground truth: (start, end) s when the answer was in view (eval/grounding.py)

    def answer_index(self) -> int | None:
        """The index of the correct choice; None for an open question (or an answer naming no choice)."""
        return _answer_index(self.answer, self.choices)


@dataclass(frozen=True, slots=True)
class VideoQuestions:
    video_id: str  # matches a bag's name, a video file's stem or a text stream's name
    duration: float | None  # seconds, when the file gives it
    questions: tuple[EvalQuestion, ...] = field(default_factory=tuple)  # in end_time order


def strip_choice_prefixes(choices: list[str]) -> list[str]:
    """Drop "A. " style prefixes when every choice has one, lettered A, B, C... in order."""
    matches = [_PREFIX.match(c) for c in choices]
    if choices and all(m is not None and m.group(1) == LETTERS[i] for i, m in enumerate(matches)):
        return [c[m.end():].strip() for c, m in zip(choices, matches)]
    return [c.strip() for c in choices]


def _answer_index(answer: str, choices: tuple[str, ...]) -> int | None:
    if not choices:
        return None
    letter = _LETTER.match(answer)
    if letter is not None and LETTERS.index(letter.group(1)) < len(choices):
        return LETTERS.index(letter.group(1))
    prefix = _PREFIX.match(answer)
    text = answer[prefix.end():].strip() if prefix else answer.strip()  # "B. green" -> "green"
    folded = [c.casefold() for c in choices]
    for candidate in (answer.strip().casefold(), text.casefold()):
        if folded.count(candidate) == 1:
            return folded.index(candidate)
    return None


def _number(value, where: str, name: str, required: bool) -> float | None:
    if value is None:
        if required:
            raise QuestionFileError(f"{where}: '{name}' is missing")
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise QuestionFileError(f"{where}: '{name}' must be a number of seconds >= 0, got {value!r}")
    return float(value)


def _spans(raw, where: str) -> tuple[tuple[float, float], ...]:
    """``time_spans``: a list of [start, end] pairs of seconds >= 0, start <= end."""
    if not isinstance(raw, list):
        raise QuestionFileError(f"{where}: 'time_spans' must be a list of [start, end] pairs, got {raw!r}")
    spans = []
    for i, pair in enumerate(raw):
        if not isinstance(pair, list) or len(pair) != 2:
            raise QuestionFileError(f"{where}: time_spans[{i}] must be a [start, end] pair, got {pair!r}")
        a = _number(pair[0], where, f"time_spans[{i}][0]", required=True)
        b = _number(pair[1], where, f"time_spans[{i}][1]", required=True)
        if a > b:
            raise QuestionFileError(f"{where}: time_spans[{i}] starts at {a} after its end {b}")
        spans.append((a, b))
    return tuple(spans)


def _question(entry, where: str) -> EvalQuestion:
    if not isinstance(entry, dict):
        raise QuestionFileError(f"{where}: expected an object, got {type(entry).__name__}")
    text = entry.get("question")
    if not isinstance(text, str) or not text.strip():
        raise QuestionFileError(f"{where}: 'question' must be a non-empty string")
    raw_choices = entry.get("choices") or []
    if not isinstance(raw_choices, list) or not all(isinstance(c, str) and c.strip() for c in raw_choices):
        raise QuestionFileError(f"{where}: 'choices' must be a list of non-empty strings")
    if len(raw_choices) == 1 or len(raw_choices) > len(LETTERS):
        raise QuestionFileError(f"{where}: a multiple-choice question needs 2 to 26 choices, got {len(raw_choices)}")
    answer = entry.get("answer")
    if isinstance(answer, int) and not isinstance(answer, bool) and raw_choices and 0 <= answer < len(raw_choices):
        answer = LETTERS[answer]  # a 0-based option index, as some converted files give
    if not isinstance(answer, str) or not answer.strip():
        raise QuestionFileError(f"{where}: 'answer' must be a non-empty string (an option letter or text)")
    end = _number(entry.get("end_time"), where, "end_time", required=True)
    start = _number(entry.get("start_time"), where, "start_time", required=False)
    if start is not None and start > end:
        raise QuestionFileError(f"{where}: start_time {start} is after end_time {end}")
    qtype = entry.get("question_type", "") or ""
    if not isinstance(qtype, str):
        raise QuestionFileError(f"{where}: 'question_type' must be a string, got {qtype!r}")
    raw_evidence = entry.get("evidence_stamps") or []
    if not isinstance(raw_evidence, list):
        raise QuestionFileError(f"{where}: 'evidence_stamps' must be a list of seconds, got {raw_evidence!r}")
    evidence = tuple(_number(v, where, "evidence_stamps[]", required=True) for v in raw_evidence)
    spans = _spans(entry.get("time_spans") or [], where)
    q = EvalQuestion(text.strip(), tuple(strip_choice_prefixes(raw_choices)), answer.strip(), end, start, qtype.strip(),
                     evidence, spans)
    if q.choices and q.answer_index() is None:
        raise QuestionFileError(f"{where}: answer {answer!r} is neither an option letter nor the text of one of {list(q.choices)}")
    return q


def parse_questions(data, source: str = "questions") -> list[VideoQuestions]:
    """Validate parsed JSON in the annotation schema; raises QuestionFileError naming the entry."""
    if not isinstance(data, list):
        raise QuestionFileError(f"{source}: expected a JSON list of videos, got {type(data).__name__}")
    videos, seen = [], set()
    for i, video in enumerate(data):
        where = f"{source}: videos[{i}]"
        if not isinstance(video, dict):
            raise QuestionFileError(f"{where}: expected an object, got {type(video).__name__}")
        vid = video.get("video_id")
        if not isinstance(vid, str) or not vid.strip():
            raise QuestionFileError(f"{where}: 'video_id' must be a non-empty string")
        if vid in seen:
            raise QuestionFileError(f"{where}: video_id {vid!r} appears twice")
        seen.add(vid)
        where = f"{where} ({vid})"
        duration = _number(video.get("duration"), where, "duration", required=False)
        convs = video.get("conversations")
        if not isinstance(convs, list):
            raise QuestionFileError(f"{where}: 'conversations' must be a list")
        qs = [_question(c, f"{where}.conversations[{j}]") for j, c in enumerate(convs)]
        qs.sort(key=lambda q: q.end_time)  # stable: ties keep the file's order
        videos.append(VideoQuestions(vid, duration, tuple(qs)))
    return videos


def load_questions(path: str | Path) -> list[VideoQuestions]:
    """Read and validate a question file; raises QuestionFileError (also for unreadable or non-JSON files)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise QuestionFileError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise QuestionFileError(f"{path}: not JSON: {exc}") from exc
    return parse_questions(data, str(path))


def select_video(videos: list[VideoQuestions], name: str) -> VideoQuestions:
    """The entry for stream ``name``, or the only entry; QuestionFileError naming what there is otherwise."""
    for video in videos:
        if video.video_id == name:
            return video
    if len(videos) == 1:
        return videos[0]
    ids = ", ".join(repr(v.video_id) for v in videos[:10]) + (" ..." if len(videos) > 10 else "")
    raise QuestionFileError(f"no video_id {name!r} in the question file (it has {ids}); pass --video-id to choose one")
