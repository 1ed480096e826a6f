"""What an active node publishes about itself: ``~/memory_stats`` and ``/diagnostics``, each on its timer.

Both are stamped with the node clock (so they follow ``use_sim_time``) and read the node's
engine, worker, counters, periodic snapshotter, poses and long-replay archive at each tick;
a tick that fires just before a deactivation publishes nothing.
"""

from __future__ import annotations

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from videokv_interfaces.msg import MemoryStats

from videokv_node.models.adapter import VideoLLMAdapter
from videokv_node.models.chat_adapter import ChatVideoLLMAdapter
from videokv_node.ros import conversions
from videokv_node.ros.diagnostics import DiagnosticsPublisher, health_config
from videokv_node.ros.node_host import NodeHost


class StatusPublishers:
    """The ``~/memory_stats`` publisher and the ``/diagnostics`` publisher of an active node, with their timers."""

    def __init__(self, node: NodeHost) -> None:
        self._node = node
        s = node.settings.node
        self._stats_pub = node.create_publisher(MemoryStats, "~/memory_stats", 10)
        self._stats_timer = node.create_timer(s.stats_period_s, self.stats_callback,
                                              callback_group=MutuallyExclusiveCallbackGroup())
        self._diagnostics = DiagnosticsPublisher(node)
        self._diagnostics_timer = node.create_timer(s.diagnostics_period_s, self.diagnostics_callback,
                                                    callback_group=MutuallyExclusiveCallbackGroup())

    def destroy(self) -> None:
        """Remove the timers and publishers (the node is deactivated); the health history goes with this object."""
        node = self._node
        node.destroy_timer(self._diagnostics_timer)
        self._diagnostics.destroy()
        node.destroy_timer(self._stats_timer)
        node.destroy_publisher(self._stats_pub)

    def frame_received(self, camera: str) -> None:
        """A frame arrived on ``camera`` (for the per-camera rate and silence of /diagnostics)."""
        self._diagnostics.frame_received(camera)

    def set_config(self, old, new) -> None:
        """New NodeSettings (run-time parameters): thresholds from the next report, the period from the next tick."""
        self._diagnostics.monitor.set_config(health_config(new))
        if new.diagnostics_period_s != old.diagnostics_period_s:
            self._diagnostics_timer.timer_period_ns = int(new.diagnostics_period_s * 1e9)

    def stats_callback(self) -> None:
        """Publish ~/memory_stats (node clock, so it follows use_sim_time)."""
        node = self._node
        engine, worker = node.engine, node.worker
        if engine is None or worker is None:  # fired just before a deactivation
            return
        msg = MemoryStats()
        msg.header.stamp = node.get_clock().now().to_msg()
        counters = node.counters.read()
        conversions.fill_stats(msg, engine.stats(), counters, worker.queue_depth, node.settings.node.model,
                               str(engine.adapter.device), vision_backend=_vision_backend(engine.adapter))
        snapshots, long_replay = node.snapshotter, node.long_replay
        if snapshots is not None:
            status = snapshots.status(node.get_clock().now().nanoseconds)
            msg.last_snapshot_stamp = conversions.ns_to_time(status.last_good_ns)
            msg.snapshots_failed = status.failed
        msg.spava_archive_bytes = long_replay.archive.bytes if long_replay is not None else 0
        self._stats_pub.publish(msg)

    def diagnostics_callback(self) -> None:
        """Publish /diagnostics: per-camera rate and silence, ingest, memory fill, model."""
        node = self._node
        engine, worker = node.engine, node.worker
        if node.status is None or engine is None or worker is None:  # fired just before a deactivation
            return
        self._diagnostics.publish(node.counters.read(), engine, worker, snapshots=node.snapshotter, poses=node.poses,
                                  intake=node.intake)


def _vision_backend(adapter: VideoLLMAdapter) -> str:
    """The name of what encodes the frames; "" for an adapter the interface promises none of."""
    return adapter.vision_backend.name if isinstance(adapter, ChatVideoLLMAdapter) else ""
