"""The evaluation report's maps (eval/evidence_map.py): where each answer's evidence was seen against where the truth
was, both placed on the bag's odometry. Exact positions, on a bag whose odometry drives along x at 0.5 m/s (the robot
bag's first phase, eval/robot_bag.py), replayed through ``replay`` into a target that answers with known stamps."""

from __future__ import annotations

import numpy as np
import pytest

from videokv_node.eval import robot_bag as rb
from videokv_node.eval.bag_io import ImageBag, image_message, write_messages
from videokv_node.eval.evidence_map import PoseTrack, draw_map, question_map
from videokv_node.eval.questions import parse_questions
from videokv_node.eval.replay import replay
from videokv_node.eval.results import ResultWriter
from videokv_node.eval.target import MemoryState, ReplayCounts, Reply

NS = 1_000_000_000
START = rb.START_NS
EVIDENCE_S = (3.0, 7.52)  # what the target answers with: 1.5 m and 3.76 m along x


class StampTarget:
    """A ``BagTarget`` that admits every image and answers every question with the frames at ``EVIDENCE_S``."""

    via = "stamps"

    def __init__(self) -> None:
        self.counts = ReplayCounts()

    def offer(self, image) -> None:
        self.counts.messages += 1
        self.counts.admitted += 1

    def settle(self) -> None:
        pass

    def relay(self, message) -> None:
        pass

    def ask(self, q) -> Reply:
        return Reply("yellow", 3, [START + round(s * NS) for s in EVIDENCE_S], 0.01, 0.02, "likelihood")

    def memory(self) -> MemoryState:
        return MemoryState(10, 0, 0, 0, 0.0)

    def report(self, writer, origin_ns: int) -> dict:
        return {}

    def close(self) -> None:
        pass


def flat(points) -> list[float]:
    return [float(v) for p in points for v in p]


def odometry_bag(path, seconds: float = 10.0) -> None:
    msgs = [("/odom", START + k * NS // 20, rb.odometry(START + k * NS // 20, k / 20)) for k in range(int(seconds * 20) + 1)]
    msgs += [("/camera/image_raw", START + i * NS + 1, image_message(np.zeros((16, 16, 3), np.uint8), START + i * NS + 1))
             for i in range(int(seconds))]
    write_messages(path, sorted(msgs, key=lambda m: m[1]))


def questions(name: str):
    convs = [{"question": "What colour is the triangle?", "choices": ["blue", "green", "red", "yellow"], "answer": "yellow",
              "end_time": 9.0, "evidence_stamps": [5.0, 6.0]},
             {"question": "What did you pass?", "answer": "a sign", "end_time": 9.5, "time_spans": [[2.0, 4.0]]},
             {"question": "Anything?", "answer": "no", "end_time": 9.6}]  # no truth: no map
    return parse_questions([{"video_id": name, "conversations": convs}])[0]


def test_the_report_maps_each_answers_evidence_against_the_truth_on_the_odometry(tmp_path):
    odometry_bag(tmp_path / "drive")
    writer = ResultWriter(tmp_path / "out", {})
    with ImageBag(tmp_path / "drive") as bag:
        extra = replay(bag, questions(bag.name), StampTarget(), writer, progress=False)
    writer.finish(extra)

    track = writer.track
    assert track.topic == "/odom" and len(track) == 201
    assert track.at(START + 3 * NS + NS // 50) == pytest.approx((1.51, 0.0))  # between two ticks: interpolated
    assert track.at(START - 1) is None and track.at(START + 11 * NS) is None  # no extrapolation
    first, second, third = writer.rows
    assert first.truth_stamps == [START + 5 * NS, START + 6 * NS] and second.truth_spans == [(START + 2 * NS, START + 4 * NS)]

    m1 = question_map("1", first.evidence_stamps, first.truth_stamps, first.truth_spans, track)
    assert flat(m1.evidence) == pytest.approx([1.5, 0.0, 3.76, 0.0]) and flat(m1.truth) == pytest.approx([2.5, 0.0, 3.0, 0.0])
    assert m1.nearest_m == pytest.approx(0.76) and m1.off_track == 0
    m2 = question_map("2", second.evidence_stamps, second.truth_stamps, second.truth_spans, track)
    assert [x for x, _ in m2.truth] == pytest.approx([0.5 * k / 20 for k in range(40, 80)])  # the path in [2, 4) s
    assert m2.nearest_m == pytest.approx(0.0)  # the evidence at 3 s lies on the span's path

    # What is drawn is those positions: the path, then the truth, then the evidence.
    fig = draw_map(m1)
    ax = fig.axes[0]
    assert list(ax.lines[0].get_xdata()) == pytest.approx([x for x, _ in track.path()])
    assert flat(ax.collections[0].get_offsets().tolist()) == pytest.approx([2.5, 0.0, 3.0, 0.0])
    assert flat(ax.collections[1].get_offsets().tolist()) == pytest.approx([1.5, 0.0, 3.76, 0.0])

    report = (tmp_path / "out" / "report.md").read_text()
    assert "## Where the evidence was seen" in report
    assert "![1. What colour is the triangle?" in report and "(map_001.png)" in report and "(map_002.png)" in report
    assert "nearest evidence to the truth: 0.76 m" in report and "map_003.png" not in report
    assert (tmp_path / "out" / "map_001.png").stat().st_size > 1000 and not (tmp_path / "out" / "map_003.png").exists()


def test_evidence_off_the_odometry_is_counted_not_drawn_and_a_bag_without_odometry_has_no_maps(tmp_path):
    track = PoseTrack()
    for k in range(3):
        track.add_pose(START + k * NS, float(k), 2.0 * k)
    track.add_pose(START, 9.0, 9.0)  # older than the newest: ignored
    qm = question_map("q", [START + NS // 2, START + 5 * NS], [START + 2 * NS], [], track)
    assert qm.evidence == [(0.5, 1.0)] and qm.off_track == 1 and qm.truth == [(2.0, 4.0)]

    write_messages(tmp_path / "still", [("/camera/image_raw", START + i * NS, image_message(np.zeros((16, 16, 3), np.uint8), START + i * NS))
                                        for i in range(3)])
    writer = ResultWriter(tmp_path / "out", {})
    with ImageBag(tmp_path / "still") as bag:
        replay(bag, questions(bag.name), StampTarget(), writer, progress=False)
    writer.finish()
    assert "Where the evidence was seen" not in (tmp_path / "out" / "report.md").read_text()
    assert not list((tmp_path / "out").glob("map_*.png"))
