"""ResultWriter: rows on disk as they come, the summary's numbers, plots and report."""

from __future__ import annotations

import csv
import json

import pytest

from videokv_node.eval.results import COLUMNS, EXTRA_COLUMNS, QuestionResult, ResultWriter


def row(correct, ttft, qtype="colour", evidence=(1_000_000_000, 2_500_000_000)):
    return QuestionResult("v", "q?", "B", "green", 1, correct, ttft, ttft * 2, 12.5, 3, 100, 4096, 1024,
                          list(evidence), question_type=qtype, stream_time_s=4.0, method="letter")


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_rows_are_on_disk_before_finish(tmp_path):
    w = ResultWriter(tmp_path / "out", {"policy": "rekv"})
    w.add(row(True, 0.1))
    rows = read_rows(tmp_path / "out" / "results.csv")  # no finish: a crash now loses nothing
    assert tuple(rows[0]) == COLUMNS + EXTRA_COLUMNS
    assert COLUMNS == ("video_id", "question", "answer", "prediction", "option_index", "correct", "ttft_s", "total_s",
                       "encode_ms_total", "frames_in_memory", "tokens_resident", "bytes_resident", "bytes_offloaded",
                       "evidence_stamps")
    assert rows[1][:6] == ["v", "q?", "B", "green", "1", "1"] and rows[1][13] == "1.000000000 2.500000000"
    w.skip("v", "late?", "after the end", 99.0)
    assert json.loads((tmp_path / "out" / "skipped.jsonl").read_text())["reason"] == "after the end"
    w.finish()


def test_summary_numbers_plots_and_report(tmp_path):
    w = ResultWriter(tmp_path, {"memory": {"policy": "full"}})
    for correct, ttft, qtype in [(True, 0.1, "colour"), (False, 0.2, "colour"), (True, 0.3, "digit"), (None, 0.4, "open")]:
        w.add(row(correct, ttft, qtype))
    for ms in (1.0, 2.0, 3.0):
        w.add_ingest_ms(ms)
    w.add_memory_sample(0.0, 100, 0)
    w.add_memory_sample(2.0, 300, 50)
    w.add_memory_sample(1.0, 200, 70)
    s = w.finish({"note": "x"})
    assert s["accuracy"] == pytest.approx(2 / 3) and s["questions_judged"] == 3 and s["questions_answered"] == 4
    assert s["accuracy_per_question_type"] == {"colour": {"accuracy": 0.5, "n": 2}, "digit": {"accuracy": 1.0, "n": 1}}
    assert s["ttft_s"]["p50"] == pytest.approx(0.25) and s["ttft_s"]["p95"] == pytest.approx(0.385)
    assert s["ingest_ms_per_frame"]["p50"] == 2.0 and s["peak_bytes_resident"] == 300 and s["peak_bytes_offloaded"] == 70
    assert s["config"] == {"memory": {"policy": "full"}} and s["note"] == "x"
    assert json.loads((tmp_path / "summary.json").read_text()) == s
    report = (tmp_path / "report.md").read_text()
    for png in ("accuracy_per_type.png", "ttft.png", "memory.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG" and f"]({png})" in report
    assert "| colour | 0.500 | 2 |" in report
    with pytest.raises(RuntimeError, match="already"):
        w.finish()


def test_empty_run_still_summarises(tmp_path):
    s = ResultWriter(tmp_path, {}).finish()
    assert s["accuracy"] is None and s["ttft_s"]["p50"] is None and (tmp_path / "report.md").exists()
