"""Bag replay through the engine: exact frames-before-question order, no re-encoding, bad inputs skipped or refused."""

from __future__ import annotations

import json
import sqlite3

import numpy as np
import pytest

from videokv_node.eval.cli import main
from videokv_node.eval.bag_io import ImageBag, write_image_bag
from videokv_node.eval.questions import parse_questions
from videokv_node.eval.replay import EngineTarget, replay
from videokv_node.eval.results import ResultWriter
from videokv_node.eval.settings import engine_settings
from videokv_node.memory.engine import VideoMemoryEngine
from videokv_node.memory.question import Frame, Question
from videokv_node.models.factory import load_adapter

NS = 1_000_000_000
START = 5 * NS  # header stamp = bag time of the first frame
PARAMS = {"model": "tiny", "memory.policy": "full", "sample_fps": 0.0, "torch_threads": 1}
CHOICES = ["red", "green", "blue"]


def bag_frames(n=12, fps=2.0):
    rng = np.random.default_rng(3)
    return [(START + round(i * NS / fps), rng.integers(0, 256, (24, 32, 3), dtype=np.uint8)) for i in range(n)]


def questions(vid, times, **extra):
    convs = [{"question": f"What colour at {t}?", "choices": CHOICES, "answer": "A", "end_time": t, **extra} for t in times]
    return parse_questions([{"video_id": vid, "conversations": convs}])[0]


def run(tmp_path, video, bag_path, params=PARAMS, rate=0.0):
    target = EngineTarget(engine_settings(params))
    ingested = []
    real_ingest = target.engine.ingest
    target.engine.ingest = lambda frames: ingested.append(len(frames)) or real_ingest(frames)
    writer = ResultWriter(tmp_path / "out", {"params": params})
    with ImageBag(bag_path) as bag:
        extra = replay(bag, video, target, writer, rate=rate, progress=False)
    summary = writer.finish(extra)
    target.close()
    return writer, summary, ingested


def test_each_question_sees_exactly_the_frames_recorded_before_it(tmp_path):
    src = bag_frames()
    write_image_bag(tmp_path / "bag", src, "/cam")
    writer, summary, ingested = run(tmp_path, questions("bag", [1.0, 2.2, 5.5, 0.0]), tmp_path / "bag")
    assert [r.stream_time_s for r in writer.rows] == [0.0, 1.0, 2.2, 5.5]
    assert [r.frames_in_memory for r in writer.rows] == [1, 3, 5, 12]  # a frame at exactly end_time is seen
    for r in writer.rows:
        assert r.evidence_stamps and max(r.evidence_stamps) <= START + round(r.stream_time_s * NS)
    assert ingested == [1] * 12  # one frame per ingest, like the node's worker, and never again per question
    assert summary["bag"]["frames_admitted"] == 12 and summary["ingest_ms_per_frame"]["n"] == 12


def test_replay_equals_the_engine_fed_by_hand(tmp_path):
    """The reference: the same frames straight into a fresh engine, then the same question."""
    src = bag_frames(8)
    write_image_bag(tmp_path / "bag", src, "/cam", compressed="png")
    writer, _, _ = run(tmp_path, questions("bag", [3.5]), tmp_path / "bag")
    s = engine_settings(PARAMS)
    engine = VideoMemoryEngine(load_adapter("tiny", seed=0), s.memory, s.generation)
    for stamp, rgb in src:
        engine.ingest([Frame("/cam", stamp, rgb)])
    ref = engine.ask(Question("What colour at 3.5?", CHOICES))
    (row,) = writer.rows
    assert row.option_index == ref.option_index and row.prediction == ref.text
    assert row.evidence_stamps == [e.stamp_ns for e in ref.evidence]


def test_sampling_follows_the_node_rule(tmp_path):
    write_image_bag(tmp_path / "bag", bag_frames(12, fps=2.0), "/cam")
    writer, summary, ingested = run(tmp_path, questions("bag", [5.5]), tmp_path / "bag", {**PARAMS, "sample_fps": 0.5})
    assert summary["bag"]["frames_admitted"] == 3 and summary["bag"]["frames_skipped"] == 9 and len(ingested) == 3
    assert writer.rows[0].evidence_stamps == [START, START + 2 * NS, START + 4 * NS]


def test_refused_and_early_questions_are_skipped_with_the_reason_late_ones_answered(tmp_path):
    write_image_bag(tmp_path / "bag", bag_frames(6), "/cam")
    video = parse_questions([{"video_id": "bag", "conversations": [
        {"question": "ok?", "choices": CHOICES, "answer": "A", "end_time": 1.0},
        {"question": "long " * 300, "choices": CHOICES, "answer": "A", "end_time": 1.5},
        {"question": "too late?", "choices": CHOICES, "answer": "A", "end_time": 60.0},
    ]}])[0]
    writer, summary, _ = run(tmp_path, video, tmp_path / "bag", {**PARAMS, "memory.max_question_tokens": 200})
    # After the bag's end (2.5 s), as at the end of a video in ReKV's files: answered from the whole bag.
    assert [r.question for r in writer.rows] == ["ok?", "too late?"]
    assert writer.rows[1].frames_in_memory == 6 and writer.rows[1].stream_time_s == 60.0
    reasons = [s["reason"] for s in summary["skipped"]]
    assert len(reasons) == 1 and "longer than the limit" in reasons[0] and reasons[0].startswith("refused:")
    assert len((tmp_path / "out" / "skipped.jsonl").read_text().splitlines()) == 1


def test_a_bag_corrupt_part_way_keeps_the_rows_before_it(tmp_path):
    write_image_bag(tmp_path / "bag", bag_frames(10), "/cam", storage="sqlite3")
    (db,) = (tmp_path / "bag").glob("*.db3")
    with sqlite3.connect(db) as con:  # the 7th message (bag time 3.0 s) becomes garbage
        con.execute("UPDATE messages SET data = x'000100' WHERE timestamp = ?", (START + 3 * NS,))
    writer, summary, _ = run(tmp_path, questions("bag", [1.0, 2.0, 4.0]), tmp_path / "bag")
    assert [r.stream_time_s for r in writer.rows] == [1.0, 2.0]
    assert "unreadable part-way" in summary["bag_error"]
    assert summary["skipped"][0]["stream_time_s"] == 4.0 and "not asked" in summary["skipped"][0]["reason"]
    assert len((tmp_path / "out" / "results.csv").read_text().splitlines()) == 3


def test_rate_paces_the_stream(tmp_path):
    import time

    write_image_bag(tmp_path / "bag", bag_frames(5), "/cam")  # 2 s of stream
    t0 = time.monotonic()
    run(tmp_path, questions("bag", [2.0]), tmp_path / "bag", rate=8.0)
    assert time.monotonic() - t0 >= 2.0 / 8.0


def test_cli_writes_everything_and_refuses_bad_inputs(tmp_path, capsys):
    write_image_bag(tmp_path / "clip", bag_frames(6), "/cam")
    qfile = tmp_path / "q.json"
    qfile.write_text(json.dumps([
        {"video_id": "clip", "conversations": [{"question": "c?", "choices": CHOICES, "answer": "red", "end_time": 2,
                                                "question_type": "colour"}]},
        {"video_id": "other", "conversations": []},
    ]))
    args = [str(tmp_path / "clip"), str(qfile), "--torch-threads", "1", "--policy", "full", "--no-progress"]
    assert main(args + ["--out", str(tmp_path / "o")]) == 0
    for name in ("results.csv", "summary.json", "report.md", "ttft.png", "memory.png", "accuracy_per_type.png"):
        assert (tmp_path / "o" / name).exists(), name
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["config"]["video_id"] == "clip" and summary["config"]["settings"]["memory"]["policy"] == "full"

    assert main(args + ["--out", str(tmp_path / "o2"), "--topics", "/nope"]) == 2
    assert "no image topic /nope in the bag; its image topics: /cam (Image)" in capsys.readouterr().err
    assert main(args + ["--out", str(tmp_path / "o3"), "--video-id", "missing"]) == 2
    assert "no video_id 'missing'" in capsys.readouterr().err
    assert main(args + ["--out", str(tmp_path / "o4"), "--param", "memory.nonsense=1"]) == 2
    assert "unknown parameter(s) memory.nonsense" in capsys.readouterr().err
    # eval never imports ROS: the library's CLI refuses --via ros, naming the ROS adapter's command (programs/evaluate.py);
    # the `python -m videokv_node.eval` command hands it over (tests/integration/test_commands_before_issue19.py).
    assert main(args + ["--out", str(tmp_path / "o5"), "--via", "ros"]) == 2
    assert "use python -m videokv_node.programs.evaluate (the same arguments)" in capsys.readouterr().err
    assert not any((tmp_path / o).exists() for o in ("o2", "o3", "o5"))


def test_cli_unknown_video_id_when_the_bag_name_matches_nothing(tmp_path, capsys):
    write_image_bag(tmp_path / "clip", bag_frames(2), "/cam")
    qfile = tmp_path / "q.json"
    qfile.write_text(json.dumps([{"video_id": "a", "conversations": []}, {"video_id": "b", "conversations": []}]))
    assert main([str(tmp_path / "clip"), str(qfile), "--out", str(tmp_path / "o")]) == 2
    assert "no video_id 'clip' in the question file (it has 'a', 'b')" in capsys.readouterr().err


def test_cloze_option_scoring_when_available(tmp_path):
    pytest.importorskip("videokv_node.eval.option_scoring")
    if not hasattr(VideoMemoryEngine, "score_continuations"):
        pytest.skip("the engine has no score_continuations yet")
    write_image_bag(tmp_path / "bag", bag_frames(4), "/cam")
    target = EngineTarget(engine_settings(PARAMS), option_scoring="cloze")
    writer = ResultWriter(tmp_path / "out", {})
    with ImageBag(tmp_path / "bag") as bag:
        replay(bag, questions("bag", [1.5]), target, writer, progress=False)
    (row,) = writer.rows
    assert row.method == "cloze" and row.prediction == CHOICES[row.option_index]


def test_text_stream_is_handed_to_text_stream_main(monkeypatch):
    import sys
    import types

    seen = {}
    fake = types.ModuleType("videokv_node.eval.text_stream")
    fake.add_arguments = lambda p: p.add_argument("--model", default="smollm2")
    fake.main = lambda args: seen.setdefault("args", args) and 0
    monkeypatch.setitem(sys.modules, "videokv_node.eval.text_stream", fake)
    assert main(["--text-stream", "frames.jsonl", "q.json", "--model", "x"]) == 0
    assert seen["args"].text_stream == ["frames.jsonl", "q.json"] and seen["args"].model == "x"


def test_text_stream_missing_is_a_clear_error(monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "videokv_node.eval.text_stream", None)  # import raises ImportError
    assert main(["--text-stream", "frames.jsonl", "q.json"]) == 2
    assert "--text-stream needs videokv_node/eval/text_stream.py" in capsys.readouterr().err
