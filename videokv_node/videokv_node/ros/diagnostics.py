"""``/diagnostics`` for the videokv node: the ``HealthMonitor``'s report as a DiagnosticArray.

Published directly (no diagnostic_updater) on the absolute topic ``/diagnostics``, where
diagnostic aggregators and rqt_robot_monitor look; one status per camera
("videokv: camera <topic>") and one for memory and model ("videokv: memory"),
hardware_id the node's fully qualified name.
"""

from __future__ import annotations

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue

from videokv_node.ingest.pose_history import WITHOUT_POSE_REASONS
from videokv_node.ros.node_host import NodeHost
from videokv_node.runtime.health import HealthConfig, HealthMonitor, Level, ModelInfo, Status, device_memory

TOPIC = "/diagnostics"


def to_diagnostic_array(statuses: list[Status], stamp, hardware_id: str) -> DiagnosticArray:
    """DiagnosticArray from the monitor's statuses; every value is already a string."""
    msg = DiagnosticArray()
    msg.header.stamp = stamp
    for s in statuses:
        status = DiagnosticStatus(level=bytes([int(s.level)]), name=s.name, message=s.message, hardware_id=hardware_id)
        status.values = [KeyValue(key=k, value=v) for k, v in s.values.items()]
        msg.status.append(status)
    return msg


def health_config(s) -> HealthConfig:
    """The monitor's thresholds from the node's settings (NodeSettings.diagnostics_*)."""
    return HealthConfig(silence_warn_s=s.diagnostics_silence_warn_s, silence_error_s=s.diagnostics_silence_error_s,
                        drop_warn_ratio=s.diagnostics_drop_warn_ratio)


class DiagnosticsPublisher:
    """Owns the node's HealthMonitor and the ``/diagnostics`` publisher; the node calls ``publish`` from a timer."""

    def __init__(self, node: NodeHost) -> None:
        s = node.settings.node
        self.node = node
        cameras = [node.resolve_topic_name(t) for t in dict.fromkeys(s.image_topics + s.compressed_topics)]
        self.monitor = HealthMonitor(cameras, health_config(s))
        self._pub = node.create_publisher(DiagnosticArray, TOPIC, 10)

    def destroy(self) -> None:
        """Remove the publisher (the node is deactivated); the monitor's history goes with this object."""
        self.node.destroy_publisher(self._pub)

    def frame_received(self, camera: str) -> None:
        """A frame arrived on ``camera`` now (node clock)."""
        self.monitor.frame_received(camera, self.node.get_clock().now().nanoseconds)

    def publish(self, counters: dict[str, int], engine, worker, snapshots=None, poses=None, intake=None) -> None:
        """Report and publish, stamped with the node clock (engine and worker: the node's, while it is active).

        ``snapshots`` (a PeriodicSnapshotter, when memory.snapshot_period_s > 0) adds the status
        "videokv: snapshots": WARN when the last good snapshot is older than three periods or
        the last write failed, with the reason. ``poses`` (the node's PoseIntake, when pose_topic
        or pose_source tf is set) adds "videokv: poses" (``pose_status``). ``intake`` (the node's
        FrameIntake) adds each camera's frame counts to its status (``camera_frame_values``).
        """
        node = self.node
        now = node.get_clock().now()
        device = str(engine.adapter.device)
        adapter = engine.adapter
        model = ModelInfo(name=node.settings.node.model, device=device,
                          dtype=str(adapter.geometry.dtype).removeprefix("torch."),
                          policy=node.settings.memory.policy, vision_backend=adapter.vision_backend.name)
        statuses = self.monitor.report(
            now.nanoseconds, engine.stats(), counters, worker.frames_overflowed, worker.queue_depth,
            worker.queue_size, model, worker_alive=worker.alive, device_memory=device_memory(device),
        )
        if intake is not None:
            per_camera = camera_frame_values(intake.counts(), worker.camera_counts())
            for status in statuses:
                if status.name.startswith("videokv: camera "):
                    status.values.update(per_camera.get(status.values["topic"], {}))
        if snapshots is not None:
            statuses.append(snapshot_status(snapshots.status(now.nanoseconds)))
        if poses is not None:
            statuses.append(pose_status(poses))
        self._pub.publish(to_diagnostic_array(statuses, now.to_msg(), node.get_fully_qualified_name()))


def camera_frame_values(intake: dict[str, dict[str, int]], worker: dict[str, dict[str, int]]) -> dict[str, dict[str, str]]:
    """Per camera, its frames by stage as diagnostic values: ``frames_received``, ``frames_sampled``,
    ``frames_skipped`` (not due by sample_fps: no decode), ``frames_ingested``, and ``frames_dropped_<why>``
    for ``malformed_<reason>``, ``stale``, ``undecodable_<reason>``, ``queue_full``, ``deactivated`` and
    ``model_failed`` (only the reasons that occurred)."""
    out: dict[str, dict[str, str]] = {}
    for camera in intake.keys() | worker.keys():
        i, w = intake.get(camera, {}), worker.get(camera, {})
        values = {"frames_received": i.get("received", 0), "frames_sampled": i.get("sampled", 0),
                  "frames_skipped": i.get("skipped", 0), "frames_ingested": w.get("ingested", 0)}
        for key, n in i.items():
            if key.startswith(("malformed_", "undecodable_")) or key == "stale":
                values[f"frames_dropped_{key}"] = n
        if i.get("dropped_deactivated"):
            values["frames_dropped_deactivated"] = i["dropped_deactivated"]
        for key, name in (("overflowed", "queue_full"), ("failed", "model_failed")):
            if w.get(key):
                values[f"frames_dropped_{name}"] = w[key]
        out[camera] = {k: str(v) for k, v in values.items()}
    return out


def snapshot_status(s) -> Status:
    """The periodic snapshots' state (runtime.periodic_snapshots.SnapshotStatus) as a diagnostic status."""
    return Status(
        name="videokv: snapshots",
        level=Level.OK if s.ok else Level.WARN,
        message=s.message,
        values={"last_good_stamp_ns": str(s.last_good_ns), "last_path": s.last_path, "written": str(s.written),
                "failed": str(s.failed), "skipped": str(s.skipped), "last_error": s.last_error},
    )


def pose_status(intake) -> Status:
    """The robot poses' counters (ros/pose_intake.py): WARN while the newest sampled frame got no pose
    (no pose received yet, or frames outside the poses' span by more than pose_tolerance_s after
    pose_wait_s; with tf, no transform at its stamp within pose_tf_wait_s). The frames_waiting_for_tf,
    frames_waited_for_tf and tf_waits_cut_short keys count parked frames of either source. Frames without a pose are also counted by reason
    (``frames_without_pose_<reason>``, ingest/pose_history.py's WITHOUT_POSE_REASONS)."""
    c = intake.counters
    span = intake.history.span_ns()
    last = intake.last_frame_had_pose
    if last is False:
        level, message = Level.WARN, "the newest frame got no pose (none received near its stamp)"
    else:
        level, message = Level.OK, "no frame yet" if last is None else "frames get poses"
    return Status(
        name="videokv: poses",
        level=level,
        message=message,
        values={"source": intake.config.pose_source, "topic": intake.config.pose_topic,
                "poses_received": str(c.received), "poses_kept": str(c.added), "dropped_non_finite": str(c.non_finite),
                "dropped_backwards": str(c.backwards), "history_resets": str(c.resets),
                "frames_with_pose": str(c.frames_with_pose), "frames_without_pose": str(c.frames_without_pose),
                **{f"frames_without_pose_{reason}": str(c.without_pose.get(reason, 0)) for reason in WITHOUT_POSE_REASONS},
                "frames_waiting_for_tf": str(intake.frames_parked), "frames_waited_for_tf": str(c.frames_waited),
                "tf_waits_cut_short": str(c.waits_cut_short),
                "oldest_pose_ns": str(span[0]) if span else "", "newest_pose_ns": str(span[1]) if span else ""},
    )
