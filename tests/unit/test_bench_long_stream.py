"""``bench/long_stream.py``: the Wilson interval by hand, the ceiling stream's frames, and a smoke run
on the random-weight text model (its accuracy means nothing; the plumbing and recall columns do)."""

from __future__ import annotations

import json

import pytest

from bench import long_stream, long_stream_report
from videokv_node.eval.needles import make_streams
from videokv_node.memory.config import POLICIES
from bench.accuracy import stream_frames


def test_wilson_by_hand():
    # k=8, n=10, z=1.96: centre (0.8 + 0.19208) / 1.38416 = 0.71679; half 1.96 * sqrt(0.016 + 0.0096040) / 1.38416 = 0.22657
    lo, hi = long_stream_report.wilson(8, 10)
    assert lo == pytest.approx(0.49022, abs=1e-4) and hi == pytest.approx(0.94336, abs=1e-4)
    assert long_stream_report.wilson(0, 10)[0] == 0.0 and long_stream_report.wilson(10, 10)[1] == 1.0


def test_the_ceiling_keeps_the_needles_and_four_distractors_in_time_order():
    (stream,) = make_streams(1, 30, seed=3)
    frames = stream_frames(stream)
    short = long_stream.ceiling_frames(stream, frames)
    needles = {round(s * 1e9) for q in stream.questions for s in q.evidence_stamps}
    assert needles <= {f.stamp_ns for f in short} and len(short) == len(needles) + long_stream.CEILING_DISTRACTORS
    assert [f.stamp_ns for f in short] == sorted(f.stamp_ns for f in short)


def test_smoke_run_prints_every_row(capsys):
    assert long_stream.main(["--model", "tiny-text", "--lengths", "10", "--streams", "1", "--policies", "rekv",
                             "--budgets", "0.2", "--out", "-"]) == 0
    out = capsys.readouterr().out
    for row in ("| full |", "| ceiling", "| recency @ 20% |", "| rekv @ 20% |"):
        assert row in out
    assert "needles all attended" in out and "8/8" in out  # full attends every needle
    full = next(line for line in out.splitlines() if line.startswith("| full |")).split("|")[1:-1]
    assert [c.strip() for c in full[3:6]] == ["8/8", "1.00", "1.00"]  # every needle, every layer, every token
    assert full[6].strip() == "10.0"  # every frame of the 10 touched in every layer


def test_paper_cells_keep_their_budget_and_take_the_seeds_mechanisms():
    from bench.accuracy import memory_config

    for policy in (p for p in POLICIES if p != "full"):  # every policy with a paper of its own
        robot = memory_config(policy, 0.1, 8, 80, 24, 50)
        paper = long_stream.with_preset(robot, "paper")
        assert paper.preset == "paper"
        assert (paper.budget_tokens, paper.local_window_tokens, paper.retrieve_frames) == (
            robot.budget_tokens, robot.local_window_tokens, robot.retrieve_frames)
        assert paper.mukv == robot.mukv and paper.hermes.chunk_frames == robot.hermes.chunk_frames
    assert long_stream.with_preset(memory_config("rekv", 0.1, 8, 80, 24, 50), "paper").rekv.query == "question"
    h = long_stream.with_preset(memory_config("hermes", 0.1, 8, 80, 24, 50), "paper").hermes
    assert (h.pseudo_queries, h.recency_rate_deep) == ("live", 0.5)
    assert long_stream.with_preset(memory_config("streamkv", 0.1, 8, 80, 24, 50), "paper").streamkv.similarity == "mean"


def test_smoke_run_with_both_presets(capsys):
    assert long_stream.main(["--model", "tiny-text", "--lengths", "10", "--streams", "1", "--policies", "rekv,hermes",
                             "--presets", "robot,paper", "--budgets", "0.3", "--out", "-"]) == 0
    out = capsys.readouterr().out
    for row in ("| rekv (robot) @ 30% |", "| rekv (paper) @ 30% |", "| hermes (paper) @ 30% |"):
        assert row in out


def test_workers_give_the_rows_of_one_process(capsys, tmp_path):
    """Streams dealt to two processes and merged: the same counts as one process (TTFT aside),
    the rekv+shared rows (bench/accuracy.py's pseudo-policy) included; ``--details`` holds both
    workers' questions (``check_details``)."""
    def rows(workers: int, *extra: str) -> list[str]:
        assert long_stream.main(["--model", "tiny-text", "--lengths", "10", "--streams", "3", "--policies", "rekv,rekv+shared",
                                 "--budgets", "0.3", "--workers", str(workers), "--out", "-", *extra]) == 0
        lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "@" in line or line.startswith("| full")]
        return [line.rsplit("|", 2)[0] for line in lines]  # without the TTFT column

    one = rows(1)
    assert [line.split("|")[1].strip() for line in one] == ["full", "recency @ 30%", "rekv @ 30%", "rekv+shared @ 30%"]
    details = tmp_path / "details.jsonl"
    two = rows(2, "--details", str(details))
    assert one == two
    check_details(details, two, make_streams(3, 10, seed=0))


def check_details(path, table_rows: list[str], streams) -> None:
    """One line per row and question, every stream's, adding up to the table: right answers and
    attended needles counted from the lines equal its columns; ``full`` attends every frame."""
    by_row: dict[str, list[dict]] = {}
    for line in path.read_text().splitlines():
        d = json.loads(line)
        by_row.setdefault(d["row"], []).append(d)
    assert sorted(by_row) == sorted(["full", "ceiling (needles + 4 distractors)", "recency @ 30%", "rekv @ 30%", "rekv+shared @ 30%"])
    n = 8 * len(streams)
    for label, ds in by_row.items():
        assert len(ds) == n and {d["stream"] for d in ds} == {s.video_id for s in streams} and {d["frames"] for d in ds} == {10}
        if label.startswith("ceiling"):
            continue  # not among the rows the caller kept
        cells = next(line for line in table_rows if line.startswith(f"| {label} |")).split("|")[1:-1]
        right = sum(d["chosen"] == d["answer"] for d in ds)
        attended = sum(set(d["needles"]) <= set(d["attended"]) for d in ds)
        assert cells[2].strip().startswith(f"{right}/{n}") and cells[3].strip() == f"{attended}/{n}", (label, cells)
    frames = {s.video_id: [f.stamp_ns for f in stream_frames(s)] for s in streams}
    assert all(d["attended"] == frames[d["stream"]] for d in by_row["full"])


def test_without_leaves_the_reference_rows_out_and_the_others_unchanged(capsys):
    """``--without full,ceiling`` runs neither row; the rows it keeps give the same answers as a run with them."""
    def rows(*extra: str) -> list[str]:
        assert long_stream.main(["--model", "tiny-text", "--lengths", "10", "--streams", "1", "--policies", "rekv",
                                 "--budgets", "0.3", "--out", "-", *extra]) == 0
        lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "attended" not in line]
        return [line.rsplit("|", 2)[0] for line in lines[1:]]  # past the header table's first row; without TTFT

    every = [line for line in rows() if line.startswith(("| full", "| ceiling", "| recency", "| rekv"))]
    kept = [line for line in rows("--without", "full,ceiling") if line.startswith(("| full", "| ceiling", "| recency", "| rekv"))]
    assert [line.split("|")[1].strip() for line in every][:2] == ["full", "ceiling (needles + 4 distractors)"]
    assert kept == every[2:]
    with pytest.raises(SystemExit):
        long_stream.main(["--model", "tiny-text", "--without", "oracle", "--out", "-"])
