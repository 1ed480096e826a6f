"""Temporal grounding: spans in the question schema and the measures of eval/grounding.py, by hand."""

from __future__ import annotations

import pytest

from videokv_node.eval.grounding import distance_s, in_span, recall_at_k, span_recall, spans_ns
from videokv_node.eval.questions import QuestionFileError, parse_questions

S = 1_000_000_000


def conv(**kw):
    base = dict(question="When did you see the blue circle?", answer="at 4 s", end_time=20)
    base.update(kw)
    return [{"video_id": "v", "conversations": [base]}]


def test_schema_reads_time_spans_and_refuses_bad_ones():
    q = parse_questions(conv(time_spans=[[4, 6], [10.5, 10.5]]))[0].questions[0]
    assert q.time_spans == ((4.0, 6.0), (10.5, 10.5))
    assert parse_questions(conv())[0].questions[0].time_spans == ()
    for bad, match in (([[6, 4]], "after its end"), ([[1]], "pair"), ([[-1, 2]], ">= 0"), ("4-6", "list"),
                       ([[0, float("nan")]], ">= 0")):
        with pytest.raises(QuestionFileError, match=match):
            parse_questions(conv(time_spans=bad))


def test_spans_fall_back_to_the_evidence_stamps_as_points():
    assert spans_ns([(4.0, 6.0)], [5.0], origin_ns=100 * S) == [(104 * S, 106 * S)]
    assert spans_ns([], [5.0, 7.5]) == [(5 * S, 5 * S), (7_500_000_000, 7_500_000_000)]


def test_distance_recall_and_in_span_by_hand():
    spans = [(4 * S, 6 * S), (10 * S, 10 * S)]
    assert distance_s(5 * S, spans) == 0.0
    assert distance_s(7 * S, spans) == 1.0  # 1 s after the first span's end
    assert distance_s(12 * S, spans) == 2.0
    assert distance_s(10 * S + 500_000, spans) == 0.0  # within the 1 ms tolerance
    assert distance_s(0, spans) == 4.0
    ranked = [12 * S, 5 * S, 10 * S]
    assert recall_at_k(ranked, spans, 1) == 0.0
    assert recall_at_k(ranked, spans, 2) == 0.5
    assert recall_at_k(ranked, spans, 3) == 1.0
    assert recall_at_k(ranked, [], 3) is None
    assert span_recall([5 * S, 8 * S], spans) == 0.5
    assert in_span([5 * S, 8 * S, 10 * S, 11 * S], spans) == 0.5
    assert in_span([], spans) is None and span_recall([5 * S], []) is None
    with pytest.raises(ValueError):
        distance_s(0, [])


def test_results_carry_grounding_per_question_and_in_the_summary(tmp_path):
    import csv

    from videokv_node.eval.results import QuestionResult, ResultWriter

    writer = ResultWriter(tmp_path / "out", config={})
    base = dict(video_id="v", question="q", answer="A", prediction="x", option_index=0, correct=True, ttft_s=0.1,
                total_s=0.2, encode_ms_total=1.0, frames_in_memory=3, tokens_resident=10, bytes_resident=1,
                bytes_offloaded=0)
    writer.add(QuestionResult(**base, span_recall=1.0, in_span=0.25))
    writer.add(QuestionResult(**base, span_recall=0.0, in_span=0.0))
    writer.add(QuestionResult(**base))  # no ground truth
    summary = writer.finish()
    assert summary["grounding"] == {"n": 2, "span_recall": 0.5, "in_span": 0.125}
    with open(tmp_path / "out" / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["span_recall"], r["in_span"]) for r in rows] == [("1.0000", "0.2500"), ("0.0000", "0.0000"), ("", "")]
    assert "evidence reached 0.50 of the spans, 0.12 of the evidence frames" in (tmp_path / "out" / "report.md").read_text()
