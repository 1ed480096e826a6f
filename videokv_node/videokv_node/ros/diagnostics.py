"""``/diagnostics`` for the videokv node: the ``HealthMonitor``'s report as a DiagnosticArray.

Published directly (no diagnostic_updater) on the absolute topic ``/diagnostics``, where
diagnostic aggregators and rqt_robot_monitor look; one status per camera
("videokv: camera <topic>") and one for memory and model ("videokv: memory"),
hardware_id the node's fully qualified name.
"""

from __future__ import annotations

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.node import Node

from videokv_node.ros.health import HealthConfig, HealthMonitor, ModelInfo, Status, device_memory

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


class DiagnosticsPublisher:
    """Owns the node's HealthMonitor and the ``/diagnostics`` publisher; the node calls ``publish`` from a timer."""

    def __init__(self, node: Node) -> None:
        s = node.settings.node
        self.node = node
        cameras = [node.resolve_topic_name(t) for t in dict.fromkeys(s.image_topics + s.compressed_topics)]
        self.monitor = HealthMonitor(cameras, HealthConfig(s.diagnostics_silence_warn_s, s.diagnostics_silence_error_s))
        self._pub = node.create_publisher(DiagnosticArray, TOPIC, 10)

    def frame_received(self, camera: str) -> None:
        """A frame arrived on ``camera`` now (node clock)."""
        self.monitor.frame_received(camera, self.node.get_clock().now().nanoseconds)

    def publish(self, counters: dict[str, int]) -> None:
        """Report and publish, stamped with the node clock."""
        node = self.node
        now = node.get_clock().now()
        device = str(node.engine.adapter.device)
        adapter = node.engine.adapter
        model = ModelInfo(name=node.settings.node.model, device=device,
                          dtype=str(adapter.geometry.dtype).removeprefix("torch."),
                          policy=node.settings.memory.policy, vision_backend=adapter.vision_backend.name)
        statuses = self.monitor.report(
            now.nanoseconds, node.engine.stats(), counters, node.worker.frames_overflowed, node.worker.queue_depth,
            node.worker.queue_size, model, worker_alive=node.worker.alive, device_memory=device_memory(device),
        )
        self._pub.publish(to_diagnostic_array(statuses, now.to_msg(), node.get_fully_qualified_name()))
