"""One route for a camera frame to the model worker, and one long-replay archive write per frame (issue 45).

Every camera callback (raw, compressed) goes through ``CameraIntake.image_callback`` and every sampled
frame through ``FrameRoute.deliver``; the archive copy is written exactly once, with the frame's final
pose, whichever way the pose is resolved: none, parked until known, or looked up by the worker at ingest.
A small fake node (``NodeHost``) stands in for the videokv node: no DDS, no model.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from videokv_node.frame import Frame  # noqa: E402
from videokv_node.ingest.frame_intake import FrameIntake  # noqa: E402
from videokv_node.ingest.sampler import FrameSampler, SamplerConfig  # noqa: E402
from videokv_node.node_settings import NodeSettings  # noqa: E402
from videokv_node.pose import Pose  # noqa: E402
from videokv_node.programs.synthetic_camera import compressed_msg, image_msg  # noqa: E402
from videokv_node.ros.camera_intake import CameraIntake, FrameRoute  # noqa: E402
from videokv_node.runtime.counters import Counters  # noqa: E402

NS = 1_000_000_000
POSE = Pose.make("odom", (1.0, 2.0, 0.0), (0.0, 0.0, 0.0, 1.0))


class CountingArchive:
    """Counts every write (add, set_pose) per stamp; keeps the pose each copy was written with."""

    def __init__(self) -> None:
        self.writes: Counter[int] = Counter()
        self.poses: dict[int, Pose | None] = {}

    def add(self, camera, stamp_ns, rgb, pose=None) -> None:
        self.writes[stamp_ns] += 1
        self.poses[stamp_ns] = pose

    def set_pose(self, stamp_ns, pose) -> None:
        self.writes[stamp_ns] += 1
        self.poses[stamp_ns] = pose


class FakeLongReplay:
    def __init__(self) -> None:
        self.archive = CountingArchive()


class FakeWorker:
    """Takes each frame at once, resolving a missing pose as the model worker does at ingest."""

    def __init__(self, lookup=None) -> None:
        self.lookup, self.ingested = lookup, []

    def submit_frame(self, frame) -> bool:
        if frame.pose is None and self.lookup is not None:
            frame.pose = self.lookup(frame)
        self.ingested.append(frame)
        return True


class FakePoses:
    """A pose source: the pose topic's ``pose_at`` or, when parking, release at once with the pose."""

    def __init__(self, parks_frames: bool, deliver) -> None:
        self.parks_frames, self._deliver = parks_frames, deliver

    def pose_at(self, stamp_ns: int) -> Pose:
        return POSE

    def park(self, frame) -> None:
        frame.pose = POSE
        self._deliver(frame)


class FakeStatus:
    def frame_received(self, camera: str) -> None:
        pass


class FakeNode:
    """The parts of ``NodeHost`` the camera intake and the route read."""

    def __init__(self) -> None:
        self.intake = FrameIntake(FrameSampler(SamplerConfig(sample_fps=0.0)))  # every frame sampled
        self.counters = Counters()
        self.status, self.view, self.poses = FakeStatus(), None, None
        self.long_replay = FakeLongReplay()
        self.worker: FakeWorker | None = None
        self.callbacks: dict[str, object] = {}
        self.dropped: list[str] = []

    def resolve_topic_name(self, topic: str, *, only_expand: bool = False) -> str:
        return "/" + topic

    def create_subscription(self, msg_type, topic, callback, qos, **kwargs):
        self.callbacks[topic] = callback
        return topic

    def get_logger(self):
        return self

    def info(self, *args, **kwargs) -> None:
        pass

    warn = info

    def drop(self, message: str) -> None:
        self.dropped.append(message)


def rgb(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (12, 16, 3), dtype=np.uint8)


@pytest.mark.parametrize("poses", ["none", "parked", "worker_looks_up"])
def test_each_frame_is_archived_exactly_once_with_its_final_pose(poses):
    node = FakeNode()
    route = FrameRoute(node, worker_looks_up=poses == "worker_looks_up")
    node.worker = FakeWorker(route.pose_at_ingest if poses == "worker_looks_up" else None)
    if poses != "none":
        node.poses = FakePoses(poses == "parked", route.deliver)
    CameraIntake(node, NodeSettings(image_topics=("raw",), compressed_topics=("cam/compressed",)), route)
    for i in range(3):
        node.callbacks["raw"](image_msg(rgb(i), (10 + i) * NS))
        node.callbacks["cam/compressed"](compressed_msg(rgb(i), (20 + i) * NS))
    stamps = [(10 + i) * NS for i in range(3)] + [(20 + i) * NS for i in range(3)]
    assert sorted(f.stamp_ns for f in node.worker.ingested) == stamps
    assert node.long_replay.archive.writes == {s: 1 for s in stamps}
    want = None if poses == "none" else POSE
    assert node.long_replay.archive.poses == {s: want for s in stamps}
    assert [f.pose for f in node.worker.ingested] == [want] * 6


def test_a_malformed_frame_is_dropped_with_its_reason_and_never_archived():
    node = FakeNode()
    route = FrameRoute(node, worker_looks_up=False)
    node.worker = FakeWorker()
    CameraIntake(node, NodeSettings(image_topics=("raw",), compressed_topics=()), route)
    bad = image_msg(rgb(0), 5 * NS)
    bad.step = 1  # shorter than a row
    node.callbacks["raw"](bad)
    assert node.worker.ingested == [] and not node.long_replay.archive.writes
    assert len(node.dropped) == 1 and "dropped a frame from /raw (bad_step)" in node.dropped[0]


def test_a_frame_after_a_deactivation_is_dropped_counted_and_not_archived():
    node = FakeNode()
    route = FrameRoute(node, worker_looks_up=False)
    route.deliver(Frame("/raw", 5 * NS, rgb(0)))
    assert node.dropped == ["dropped a frame from /raw: the node is being deactivated"]
    assert node.intake.counts()["/raw"]["dropped_deactivated"] == 1
