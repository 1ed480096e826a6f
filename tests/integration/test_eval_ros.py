"""``--via ros`` against ``--via engine`` on the same bag: the node as a process over DDS gives the same answers.

The bag has two cameras (raw Image and CompressedImage), an unstamped frame, an
undecodable frame, more frames than are sampled, and questions between frames,
at a frame's exact time, open and multiple-choice, and after the end of the bag (answered from the whole bag).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from videokv_node.eval.bag_io import TYPESTORE, ImageBag, image_message, write_messages  # noqa: E402
from videokv_node.eval.questions import parse_questions  # noqa: E402
from videokv_node.eval.replay import EngineTarget, replay  # noqa: E402
from videokv_node.eval.results import ResultWriter  # noqa: E402
from videokv_node.eval.settings import engine_settings, typed_parameters  # noqa: E402

NS = 1_000_000_000
START = 100 * NS
PARAMS = typed_parameters({
    "model": "tiny", "torch_threads": 1, "sample_fps": 1, "memory.policy": "rekv", "memory.budget_tokens": 200,
    "memory.local_window_tokens": 32, "memory.retrieve_frames": 2, "max_new_tokens": 3,
})
COLOURS = ["red", "green", "blue", "white"]


def write_bag(path):
    rng = np.random.default_rng(11)
    msgs = []
    for i in range(24):  # 6 s at 4 fps on /cam_a, 1 fps sampled; /cam_b/compressed every 0.5 s
        t = START + i * NS // 4
        stamp = 0 if i == 8 else t  # an unstamped driver frame (2.0 s): stamped with its bag time by both paths
        msgs.append(("/cam_a", t, image_message(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8), stamp)))
        if i % 2 == 1:
            msgs.append(("/cam_b/compressed", t + 1, image_message(rng.integers(0, 256, (24, 32, 3), dtype=np.uint8),
                                                                   t + 1, compressed="png")))
    bad = TYPESTORE.types["sensor_msgs/msg/Image"](
        header=msgs[0][2].header, height=8, width=8, encoding="rgb8", is_bigendian=0, step=24,
        data=np.zeros(10, np.uint8))  # short data: the node drops it, so must the engine path
    msgs.insert(7, ("/cam_a", START + 3 * NS // 2 + 7, bad))
    write_messages(path, sorted(msgs, key=lambda m: m[1]))


def video(name):
    convs = [
        {"question": "What colour is the box?", "choices": COLOURS, "answer": "A", "end_time": t, "question_type": "mc"}
        for t in (0.9, 2.0, 4.26)
    ] + [{"question": "What happened?", "answer": "nothing", "end_time": 3.3, "question_type": "open"},
         {"question": "What is left?", "choices": COLOURS, "answer": "B", "end_time": 30.0}]
    return parse_questions([{"video_id": name, "conversations": convs}])[0]


def run(target, bag_path, out):
    writer = ResultWriter(out, {})
    try:
        with ImageBag(bag_path) as bag:
            extra = replay(bag, video(bag.name), target, writer, progress=False)
    finally:
        target.close()
    return writer, writer.finish(extra)


def test_ros_replay_gives_the_engine_replays_answers(ros, tmp_path):
    from videokv_node.programs.replay_target import RosTarget

    env, ctx = ros
    write_bag(tmp_path / "bag")
    settings = engine_settings(PARAMS)
    engine_rows, engine_summary = run(EngineTarget(settings), tmp_path / "bag", tmp_path / "engine")
    ros_target = RosTarget(settings, PARAMS, ["/cam_a", "/cam_b/compressed"], {"/cam_b/compressed"}, context=ctx, env=env,
                           settle_timeout_s=120, log_path=tmp_path / "node.log")
    ros_rows, ros_summary = run(ros_target, tmp_path / "bag", tmp_path / "ros")

    # The question at 30 s, after the bag's last frame (6 s), is answered from the whole bag, not skipped.
    assert len(engine_rows.rows) == 5 and ros_summary["skipped"] == [] and engine_summary["skipped"] == []
    assert engine_rows.rows[-1].stream_time_s == 30.0
    assert engine_rows.rows[-1].frames_in_memory == engine_summary["bag"]["frames_admitted"]  # every frame sampled
    assert engine_summary["bag"] == ros_summary["bag"]
    assert engine_summary["bag"]["frames_dropped"] == 1 == ros_summary["node_frames_dropped"]
    assert engine_summary["peak_bytes_offloaded"] > 0  # the budget made rekv offload: not a trivial memory
    fields = ("question", "stream_time_s", "prediction", "option_index", "evidence_stamps", "frames_in_memory",
              "tokens_resident", "bytes_resident", "bytes_offloaded", "method")
    # each reply names the scoring the node used (its answer.option_scoring, read from the node): "likelihood" here,
    # as the engine's rows say (issue 43: every ROS row said "letter")
    assert {r.method for r in ros_rows.rows if r.method} == {settings.generation.answer.option_scoring}
    for e, r in zip(engine_rows.rows, ros_rows.rows, strict=True):
        assert [getattr(e, f) for f in fields] == [getattr(r, f) for f in fields]
    assert START + 2 * NS in engine_rows.rows[1].evidence_stamps  # the unstamped frame, in the recent window at 2.0 s
    assert max(engine_rows.rows[0].evidence_stamps) <= START + int(0.9 * NS)


def test_the_ros_command_is_the_eval_cli_with_via_ros(tmp_path, monkeypatch, capsys):
    """``python -m videokv_node.programs.evaluate``: the eval CLI's checks, and --via ros builds the node's target from the bag."""
    import json

    from videokv_node.programs import evaluate

    write_bag(tmp_path / "bag")
    qfile = tmp_path / "q.json"
    qfile.write_text(json.dumps([{"video_id": "bag", "conversations": [{"question": "c?", "choices": COLOURS,
                                                                         "answer": "A", "end_time": 1}]}]))
    args = [str(tmp_path / "bag"), str(qfile), "--model", "tiny", "--torch-threads", "1", "--no-progress", "--via", "ros"]
    assert evaluate.main(args + ["--out", str(tmp_path / "o1"), "--option-scoring", "cloze"]) == 2
    assert "--option-scoring cloze needs --via engine" in capsys.readouterr().err

    made = {}

    class NoNode:  # stands in for RosTarget: records what the command gives it, starts nothing
        def __init__(self, settings, params, topics, compressed, log_path=None, relay=None):
            made.update(topics=topics, compressed=compressed, log_path=log_path, model=params["model"], relay=relay)
            raise RuntimeError("no node in this test")

    monkeypatch.setattr(evaluate, "RosTarget", NoNode)
    assert evaluate.main(args + ["--out", str(tmp_path / "o2")]) == 1  # a run that failed: summarised, status 1
    assert made == {"topics": ["/cam_a", "/cam_b/compressed"], "compressed": {"/cam_b/compressed"},
                    "log_path": tmp_path / "o2" / "node.log", "model": "tiny", "relay": {}}
    summary = json.loads((tmp_path / "o2" / "summary.json").read_text())
    assert summary["config"]["via"] == "ros" and "no node in this test" in summary["run_error"]
