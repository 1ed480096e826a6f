"""Threads around the engine: the one model worker and its queues. No ROS here either."""

from videokv_node.runtime.worker import ModelWorker, WorkerBusy, WorkerStopped

__all__ = ["ModelWorker", "WorkerBusy", "WorkerStopped"]
