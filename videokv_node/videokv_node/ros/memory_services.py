"""``~/reset``, ``~/save_memory`` and ``~/load_memory``: the memory as a whole, on request.

Each runs on the model worker between two frames, so it never cuts a frame's ingest or a
question in half; a refusal (bad snapshot path or name, a snapshot that fails its checks,
a full queue, an inactive node, a timeout) is success=false with the reason and leaves
the memory as it was. Snapshots are written and read by the engine's snapshot code
(``ros/snapshots.py`` holds the node's other snapshot steps).
"""

from __future__ import annotations

from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

from std_srvs.srv import Trigger
from videokv_interfaces.srv import LoadMemory, SaveMemory

from videokv_node.memory.engine import VideoMemoryEngine
from videokv_node.memory.snapshot.format import SnapshotError, SnapshotInfo, resolve_snapshot_path
from videokv_node.ros import snapshots
from videokv_node.ros.node_host import NodeHost
from videokv_node.runtime.worker import WorkerBusy, WorkerStopped


class MemoryServices:
    """The node's ``~/reset``, ``~/save_memory`` and ``~/load_memory``; ``node`` is the videokv node."""

    def __init__(self, node: NodeHost, callback_group) -> None:
        self._node = node
        self._services = [node.create_service(srv_type, name, callback, callback_group=callback_group)
                          for srv_type, name, callback in ((Trigger, "~/reset", self.reset_callback),
                                                           (SaveMemory, "~/save_memory", self.save_callback),
                                                           (LoadMemory, "~/load_memory", self.load_callback))]

    def destroy(self) -> None:
        """Remove the services (the node is deactivated)."""
        for service in reversed(self._services):
            self._node.destroy_service(service)
        self._services = []

    def reset_callback(self, request, response):
        """Forget every frame (queued ones, and those waiting for their transform, too)."""
        node = self._node
        try:
            poses = node.poses
            if poses is not None:
                poses.drop_parked()  # sampled before the reset: not for the new memory
            node.active_worker().reset().result(timeout=node.settings.node.question_timeout_s)
            self._reset_sampler()
        except (WorkerBusy, WorkerStopped, FutureTimeout) as exc:
            response.success, response.message = False, f"reset not done: {exc or 'timeout'}"
            return response
        node.get_logger().info("memory reset")
        response.success, response.message = True, "memory cleared"
        return response

    def save_callback(self, request, response):
        """Write the memory to a snapshot inside memory.snapshot_dir, between two frames."""
        node = self._node
        try:
            target = resolve_snapshot_path(node.settings.memory.snapshot_dir, request.name, request.path)
            worker = node.active_worker()
            info = worker.call(lambda: snapshots.save(worker.engine, target)).result(
                timeout=node.settings.node.question_timeout_s
            )
        except (SnapshotError, WorkerBusy, WorkerStopped, FutureTimeout, OSError) as exc:
            response.success, response.message = False, f"memory not saved: {exc or 'timeout'}"
            return response
        node.get_logger().info(f"memory saved to {info.path} ({info.blocks} blocks, {info.bytes} bytes)")
        response.success, response.message = True, f"saved {info.blocks} blocks"
        response.path, response.blocks, response.frames_ingested, response.bytes = str(info.path), info.blocks, info.frames_ingested, info.bytes
        return response

    def load_callback(self, request, response):
        """Replace the memory with a snapshot; a refused snapshot leaves the memory as it was, a damaged
        segment costs its own blocks (success, with the loss in ``message``)."""
        node = self._node
        try:
            target = resolve_snapshot_path(node.settings.memory.snapshot_dir, request.name, request.path)
            worker = node.active_worker()
            info = worker.call(lambda: self._load(worker.engine, target)).result(timeout=node.settings.node.question_timeout_s)
        except (SnapshotError, WorkerBusy, WorkerStopped, FutureTimeout, OSError) as exc:
            response.success, response.message = False, f"memory not loaded: {exc or 'timeout'}"
            return response
        node.get_logger().info(f"memory loaded from {info.path} ({info.blocks} blocks)")
        response.success, response.message = True, f"loaded {info.blocks} blocks"
        if info.degraded:  # a damaged segment costs its own blocks, not the snapshot: said, not hidden
            node.get_logger().error(f"snapshot {info.path.name} loaded without its damaged segments: {info.loss()}")
            response.message += f"; {info.loss()}"
        response.path, response.blocks, response.frames_ingested = str(info.path), info.blocks, info.frames_ingested
        return response

    def _load(self, engine: VideoMemoryEngine, target: Path) -> SnapshotInfo:
        """On the worker thread: load, then let frames newer than the snapshot's be sampled again."""
        info = snapshots.load(engine, target)
        self._reset_sampler()
        return info

    def _reset_sampler(self) -> None:
        """Let every camera's next frame be sampled again (the sampler is held while configured)."""
        sampler = self._node.sampler
        if sampler is not None:
            sampler.reset()
