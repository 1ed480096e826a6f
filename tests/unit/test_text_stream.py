"""``python -m videokv_node.eval --text-stream``: incremental, one row per question and method, clear refusals."""

from __future__ import annotations

import csv
import json

import pytest

from videokv_node.eval import text_stream
from videokv_node.eval.cli import main
from videokv_node.eval.needles import make_streams, write_streams
from videokv_node.memory.config import OPTION_SCORINGS

ARGS = ["--model", "tiny-text", "--policy", "rekv", "--no-progress"]


@pytest.fixture()
def inputs(tmp_path):
    paths, questions = write_streams(make_streams(1, 8, seed=3), tmp_path / "in")
    return paths[0], questions


def rows(out):
    with open(out / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_every_question_is_asked_once_per_method_after_the_frames_before_it(tmp_path, inputs, monkeypatch):
    frames, questions = inputs
    asked_after = []
    real_ask = text_stream.TextTarget.ask

    def spy(self, q):
        asked_after.append(self.engine.frames_ingested)
        return real_ask(self, q)

    monkeypatch.setattr(text_stream.TextTarget, "ask", spy)
    out = tmp_path / "out"
    assert main(["--text-stream", str(frames), str(questions), "--out", str(out), *ARGS]) == 0
    got = rows(out)
    assert [r["method"] for r in got] == list(OPTION_SCORINGS) * 8  # "both": the node's two ways
    assert asked_after == [8] * 16  # asked at the end, after all 8 frames, and nothing re-encoded
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accuracy_per_method"]["letter"]["n"] == 8
    assert summary["text_stream"]["frames"] == 8


def test_a_question_mid_stream_sees_only_the_frames_before_it(tmp_path, inputs):
    frames, questions = inputs
    data = json.loads(questions.read_text())
    data[0]["conversations"][0]["end_time"] = 6.0  # frames every 2 s: frames at 2, 4, 6 s
    data[0]["conversations"].append(dict(data[0]["conversations"][1], end_time=99.0))  # after the last frame
    data[0]["conversations"].append(dict(data[0]["conversations"][1], end_time=1.0))  # before the first (2 s)
    questions.write_text(json.dumps(data))
    out = tmp_path / "out"
    assert main(["--text-stream", str(frames), str(questions), "--out", str(out), "--option-scoring", "cloze", *ARGS]) == 0
    got = rows(out)
    first = got[0]
    assert first["frames_in_memory"] == "3" and first["stream_time_s"] == "6.000000"
    assert max(float(s) for s in first["evidence_stamps"].split()) == 6.0
    assert got[-1]["stream_time_s"] == "99.000000" and got[-1]["frames_in_memory"] == "8"  # the whole stream answers
    skipped = [json.loads(line) for line in (out / "skipped.jsonl").read_text().splitlines()]
    assert len(skipped) == 1 and "before the stream's first frame" in skipped[0]["reason"]


def test_bad_inputs_are_refused_before_anything_runs(tmp_path, inputs, capsys):
    frames, questions = inputs
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"stamp": 1, "text": "a"}\n{"stamp": 0.5, "text": "b"}\n')
    assert main(["--text-stream", str(bad), str(questions), "--out", str(tmp_path / "o1"), *ARGS]) == 2
    assert "bad.jsonl:2: stamp 0.5 is not after" in capsys.readouterr().err
    long = tmp_path / "needles-000.jsonl"
    long.write_text(json.dumps({"stamp": 1, "text": "x" * 200}) + "\n")
    assert main(["--text-stream", str(long), str(questions), "--out", str(tmp_path / "o2"), *ARGS]) == 2
    assert "frame 1 (stamp 1.0 s)" in capsys.readouterr().err
    assert main(["--text-stream", str(frames), str(questions), "--out", str(tmp_path / "o3"), "--model", "tiny",
                 "--no-progress"]) == 2
    assert "text frames need a text model" in capsys.readouterr().err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
