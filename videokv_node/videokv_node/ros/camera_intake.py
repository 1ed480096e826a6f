"""Camera intake: the node's camera subscriptions and what a frame goes through before the model.

Check the message, sample by header stamp, decode only a sampled frame, queue it for the
model worker (``ingest/frame_intake.py``); a callback never runs the model. A frame the
sampler skips costs its deserialisation and a few field reads, no decode: a 1280x720
JPEG at 15 Hz sampled at 0.5 fps is decoded once in 30 frames.

Each camera has its own mutually exclusive callback group: one camera's frames reach the
sampler in arrival order, and cameras never queue behind each other on the node's
MultiThreadedExecutor (ros/main.py). A frame waits for its robot pose outside the worker's
queue (``PoseIntake.park``, ros/pose_parking.py: the transform at its stamp with tf, a pose
at or after its stamp from a pose topic, each bounded by its wait) and reaches the worker
through ``FrameRoute.deliver``, the one route of every sampled frame to the worker. With a pose
topic and ``pose_wait_s`` 0 a frame is queued without its pose: the model worker looks it up when it
takes the frame (``FrameRoute.pose_at_ingest``). The long-replay archive gets one copy of each
frame, written by ``FrameRoute`` once the frame's pose is final.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data, qos_profile_system_default
from sensor_msgs.msg import CompressedImage, Image

from videokv_node.ingest.frame_intake import Outcome
from videokv_node.ingest.sampler import SampleDecision
from videokv_node.memory.question import Frame
from videokv_node.node_settings import NodeSettings
from videokv_node.pose import Pose
from videokv_node.ros import conversions
from videokv_node.ros.node_host import NodeHost
from videokv_node.runtime.worker import WorkerStopped

QOS = {
    "sensor_data": qos_profile_sensor_data,
    "reliable": QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE),
    "system_default": qos_profile_system_default,
}


def camera_qos(s: NodeSettings) -> QoSProfile:
    """The cameras' QoS from the node's settings (``camera_qos``, and ``camera_qos_depth`` when > 0)."""
    qos = QOS[s.camera_qos]
    if s.camera_qos_depth > 0:
        qos = QoSProfile(history=qos.history, depth=s.camera_qos_depth, reliability=qos.reliability,
                         durability=qos.durability)
    return qos


class FrameRoute:
    """The one way a sampled frame goes to the model worker, and where its long-replay copy is written, once.

    ``deliver(frame)`` takes every sampled frame: straight from a camera callback, or from
    ``PoseIntake`` once a parked frame's pose is resolved (the node hands it ``deliver``).
    The archive copy is written when the frame's pose is final, so it carries the pose its
    block gets and is written exactly once: in ``deliver`` when the pose is already known (a
    parked frame, or a node without poses), else in ``pose_at_ingest``, the model worker's pose
    lookup (a pose topic with ``pose_wait_s`` 0; the node hands it to the worker), on the worker
    thread just before the frame's ingest. A frame dropped before it reaches that point (a full
    queue, a reset, a deactivation) is not archived: it never entered the memory either.
    """

    def __init__(self, node: NodeHost, worker_looks_up: bool) -> None:
        self._node = node
        self._worker_looks_up = worker_looks_up  # set once, from the pose settings at activate

    def deliver(self, frame: Frame) -> None:
        """Queue a sampled frame for the model worker; a full queue or a deactivation drops one, counted, with the reason."""
        node = self._node
        worker = node.worker  # a local: a deactivation may clear it meanwhile
        try:
            if worker is None:
                raise WorkerStopped("no worker")
            if not worker.submit_frame(frame):
                node.drop("frame queue full: dropped the oldest frame (model slower than sample_fps)")
            if not self._worker_looks_up:  # the pose is final (or there is none): its copy now
                self._archive(frame)
        except WorkerStopped:  # deactivated while this frame was on its way (or waited for its pose)
            intake = node.intake
            if intake is not None:
                intake.count(frame.camera, "dropped_deactivated")
            node.drop(f"dropped a frame from {frame.camera}: the node is being deactivated")

    def pose_at_ingest(self, frame: Frame) -> Pose | None:
        """The model worker's pose lookup (runtime/worker.py) for a frame it takes for ingest: the pose at its stamp.

        Looked up there, not in the camera callback, so that odometry received while the frame
        waited in the queue counts; a frame still outside the poses' span by more than
        ``pose_tolerance_s`` gets none, counted. The frame's archive copy is written here, with that pose.
        """
        poses = self._node.poses  # a local: a deactivation may clear it meanwhile
        frame.pose = poses.pose_at(frame.stamp_ns) if poses is not None else None
        self._archive(frame)
        return frame.pose

    def _archive(self, frame: Frame) -> None:
        """The frame's one long-replay copy, with its final pose (if spava.enabled)."""
        long_replay = self._node.long_replay
        if long_replay is not None:
            long_replay.archive.add(frame.camera, frame.stamp_ns, frame.rgb, frame.pose)


# Per message type, the two steps of ingest/frame_intake.py over it: check (cheap, every frame) and decode (sampled only).
MESSAGE_STEPS: dict[type, tuple[Callable[[Any], None], Callable[[Any], np.ndarray]]] = {
    Image: (conversions.check_image, conversions.image_to_rgb),
    CompressedImage: (conversions.check_compressed, conversions.compressed_to_rgb),
}


class CameraIntake:
    """The camera subscriptions of an active node; ``node`` is the videokv node (its worker, frame intake,
    status publishers, poses and long-replay archive, read at each frame: a deactivation clears them)."""

    def __init__(self, node: NodeHost, s: NodeSettings, route: FrameRoute) -> None:
        """Subscribe to ``s.image_topics`` and ``s.compressed_topics`` (NodeSettings); a topic in both, once."""
        self._node = node
        self._route = route
        self._subscriptions: list[Any] = []
        qos = camera_qos(s)
        for topic in dict.fromkeys(s.image_topics + s.compressed_topics):
            compressed = topic in s.compressed_topics or topic.endswith("/compressed")
            msg_type = CompressedImage if compressed else Image
            camera = node.resolve_topic_name(topic)
            self._subscriptions.append(node.create_subscription(
                msg_type, topic, functools.partial(self.image_callback, camera=camera, steps=MESSAGE_STEPS[msg_type]),
                qos, callback_group=MutuallyExclusiveCallbackGroup(),  # one per camera: none waits for another
            ))
            node.get_logger().info(f"camera {camera} ({msg_type.__name__}, qos {s.camera_qos})")

    def destroy(self) -> None:
        """Remove the subscriptions (the node is deactivated): no frame is taken after this returns."""
        for subscription in reversed(self._subscriptions):
            self._node.destroy_subscription(subscription)
        self._subscriptions = []

    def image_callback(self, msg: Any, camera: str, steps: tuple[Callable[[Any], None], Callable[[Any], np.ndarray]]) -> None:
        """Every camera's callback, whatever its message type: check, sample by header stamp, decode if sampled,
        then on to ``FrameRoute.deliver`` (or to wait for its pose); never runs the model.

        A malformed frame is counted (dropped) whether or not it would have been sampled and
        never takes a sample slot; a sampled frame that fails to decode is counted and gives
        its slot back to the camera's next frame (ingest/frame_intake.py). Both are dropped here, with the reason.
        """
        node = self._node
        status, intake = node.status, node.intake
        if node.worker is None or status is None or intake is None:  # delivered just before a deactivation: not taken
            return
        node.counters.add("received")
        status.frame_received(camera)
        stamp_ns = conversions.time_to_ns(msg.header.stamp)
        if stamp_ns == 0:  # unstamped driver: fall back to the node clock (sim time aware)
            stamp_ns = node.get_clock().now().nanoseconds
        check, decode = steps
        result = intake.offer(camera, stamp_ns, lambda: check(msg), lambda: decode(msg))
        if result.outcome is Outcome.SKIPPED:
            return
        if result.outcome is not Outcome.SAMPLED:
            why = f" ({result.reason}): {result.message}" if result.reason else ": stamp older than the newest one seen"
            node.drop(f"dropped a frame from {camera}{why}")
            return
        if result.decision is SampleDecision.RESET:
            node.get_logger().warn(f"{camera}: stamps jumped back in time, treating it as a clock reset")
        node.counters.add("sampled")
        assert result.rgb is not None  # SAMPLED carries the decoded frame (IntakeResult)
        view = node.view
        if view is not None:  # a strided thumbnail for ~/memory_sheet, no encoding (ros/memory_view.py)
            view.frame_sampled(camera, stamp_ns, result.rgb)
        frame, poses = Frame(camera, stamp_ns, result.rgb), node.poses
        if poses is not None and poses.parks_frames:  # waits for its pose, then FrameRoute.deliver
            poses.park(frame)
        else:  # with a pose topic and pose_wait_s 0, no pose yet: the worker looks it up (FrameRoute.pose_at_ingest)
            self._route.deliver(frame)
