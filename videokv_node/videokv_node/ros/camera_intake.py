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
through ``deliver_frame``. With a pose topic and ``pose_wait_s`` 0 a frame is queued without
its pose: the model worker looks it up when it takes the frame (``frame_pose``).
"""

from __future__ import annotations

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data, qos_profile_system_default
from sensor_msgs.msg import CompressedImage, Image

from videokv_node.ingest.frame_intake import Outcome
from videokv_node.ingest.sampler import SampleDecision
from videokv_node.memory.question import Frame
from videokv_node.pose import Pose
from videokv_node.ros import conversions
from videokv_node.ros.node_host import NodeHost
from videokv_node.runtime.worker import WorkerStopped

QOS = {
    "sensor_data": qos_profile_sensor_data,
    "reliable": QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE),
    "system_default": qos_profile_system_default,
}


def camera_qos(s) -> QoSProfile:
    """The cameras' QoS from the node's settings (``camera_qos``, and ``camera_qos_depth`` when > 0)."""
    qos = QOS[s.camera_qos]
    if s.camera_qos_depth > 0:
        qos = QoSProfile(history=qos.history, depth=s.camera_qos_depth, reliability=qos.reliability,
                         durability=qos.durability)
    return qos


def frame_pose(node: NodeHost, stamp_ns: int) -> Pose | None:
    """The model worker's pose lookup (runtime/worker.py) for a frame it takes for ingest: the pose at its stamp.

    Looked up there, not in the camera callback, so that odometry received while the frame
    waited in the queue counts; a frame still outside the poses' span by more than
    ``pose_tolerance_s`` gets none, counted. The frame's long-replay archive copy is given
    the same pose, so the block and the copy Spava replays never disagree.
    """
    poses, long_replay = node.poses, node.long_replay  # locals: a deactivation may clear them meanwhile
    pose = poses.pose_at(stamp_ns) if poses is not None else None
    if long_replay is not None:
        long_replay.archive.set_pose(stamp_ns, pose)
    return pose


def deliver_frame(node: NodeHost, frame: Frame) -> None:
    """Queue a sampled frame whose pose is already resolved (a parked frame, after its wait) for the model worker.

    The long-replay archive's copy gets the same pose, as in ``frame_pose``.
    """
    worker, long_replay = node.worker, node.long_replay  # locals: a deactivation may clear them meanwhile
    if long_replay is not None:
        long_replay.archive.set_pose(frame.stamp_ns, frame.pose)
    try:
        if worker is None:
            raise WorkerStopped("no worker")
        if not worker.submit_frame(frame):
            node.drop("frame queue full: dropped the oldest frame (model slower than sample_fps)")
    except WorkerStopped:  # deactivated while this frame waited for its pose
        intake = node.intake
        if intake is not None:
            intake.count(frame.camera, "dropped_deactivated")
        node.drop(f"dropped a frame from {frame.camera}: the node is being deactivated")


class CameraIntake:
    """The camera subscriptions of an active node; ``node`` is the videokv node (its worker, frame intake,
    status publishers, poses and long-replay archive, read at each frame: a deactivation clears them)."""

    def __init__(self, node: NodeHost, s) -> None:
        """Subscribe to ``s.image_topics`` and ``s.compressed_topics`` (NodeSettings); a topic in both, once."""
        self._node = node
        self._subscriptions = []
        qos = camera_qos(s)
        for topic in dict.fromkeys(s.image_topics + s.compressed_topics):
            compressed = topic in s.compressed_topics or topic.endswith("/compressed")
            msg_type = CompressedImage if compressed else Image
            camera = node.resolve_topic_name(topic)
            self._subscriptions.append(node.create_subscription(
                msg_type, topic, lambda msg, c=camera, z=compressed: self.image_callback(msg, c, z),
                qos, callback_group=MutuallyExclusiveCallbackGroup(),  # one per camera: none waits for another
            ))
            node.get_logger().info(f"camera {camera} ({msg_type.__name__}, qos {s.camera_qos})")

    def destroy(self) -> None:
        """Remove the subscriptions (the node is deactivated): no frame is taken after this returns."""
        for subscription in reversed(self._subscriptions):
            self._node.destroy_subscription(subscription)
        self._subscriptions = []

    def image_callback(self, msg, camera: str, compressed: bool) -> None:
        """Check, sample by header stamp, decode if sampled, queue for the model worker; never runs the model.

        A malformed frame is counted (dropped) whether or not it would have been sampled and
        never takes a sample slot; a sampled frame that fails to decode is counted and gives
        its slot back to the camera's next frame (ingest/frame_intake.py).
        """
        node = self._node
        worker, status, intake = node.worker, node.status, node.intake
        if worker is None or status is None or intake is None:  # delivered just before a deactivation: not taken
            return
        node.counters.add("received")
        status.frame_received(camera)
        stamp_ns = conversions.time_to_ns(msg.header.stamp)
        if stamp_ns == 0:  # unstamped driver: fall back to the node clock (sim time aware)
            stamp_ns = node.get_clock().now().nanoseconds
        if compressed:
            result = intake.offer(camera, stamp_ns, lambda: conversions.check_compressed(msg),
                                  lambda: conversions.compressed_to_rgb(msg))
        else:
            result = intake.offer(camera, stamp_ns, lambda: conversions.check_image(msg),
                                  lambda: conversions.image_to_rgb(msg))
        if result.outcome is Outcome.SKIPPED:
            return
        if result.outcome is not Outcome.SAMPLED:
            why = f" ({result.reason}): {result.message}" if result.reason else ": stamp older than the newest one seen"
            node.drop(f"dropped a frame from {camera}{why}")
            return
        if result.decision is SampleDecision.RESET:
            node.get_logger().warn(f"{camera}: stamps jumped back in time, treating it as a clock reset")
        node.counters.add("sampled")
        rgb = result.rgb
        long_replay = node.long_replay
        if long_replay is not None:
            # The pose known now, uncounted; the worker's lookup at ingest (frame_pose) replaces it with
            # the block's pose. A frame dropped before ingest keeps this one.
            poses = node.poses
            long_replay.archive.add(camera, stamp_ns, rgb, poses.peek(stamp_ns) if poses is not None else None)
        view = node.view
        if view is not None:  # a strided thumbnail for ~/memory_sheet, no encoding (ros/memory_view.py)
            view.frame_sampled(camera, stamp_ns, rgb)
        frame, poses = Frame(camera, stamp_ns, rgb), node.poses
        if poses is not None and poses.parks_frames:  # waits for its pose, then deliver_frame
            poses.park(frame)
            return
        try:
            # No pose yet: the worker looks it up when it takes the frame for ingest (runtime/worker.py), so
            # odometry that arrives while the frame waits in the queue counts.
            if not worker.submit_frame(frame):
                node.drop("frame queue full: dropped the oldest frame (model slower than sample_fps)")
        except WorkerStopped:  # deactivated while this frame was on its way
            intake.count(camera, "dropped_deactivated")
            node.drop(f"dropped a frame from {camera}: the node is being deactivated")
