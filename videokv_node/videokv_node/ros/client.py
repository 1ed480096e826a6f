"""A small synchronous client of the videokv node, for the demo, the tests and planners' scripts.

It spins its own executor in a background thread, so calls block the caller
only, and keeps the latest ``~/memory_stats`` message.
"""

from __future__ import annotations

import threading
import time
from collections import deque

import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from std_srvs.srv import Trigger
from videokv_interfaces.msg import MemoryStats
from videokv_interfaces.srv import AskVideo, LoadMemory, SaveMemory

from videokv_node.ros.conversions import ns_to_time


class MemoryClient:
    """Calls ``<node>/ask``, ``<node>/reset``, ``<node>/save_memory`` and ``<node>/load_memory``
    and watches ``<node>/memory_stats``."""

    def __init__(
        self, node_name: str = "/videokv", context=None, client_name: str = "videokv_client", history: int = 10_000
    ) -> None:
        self.node = Node(client_name, context=context)
        self._ask = self.node.create_client(AskVideo, f"{node_name}/ask")
        self._reset = self.node.create_client(Trigger, f"{node_name}/reset")
        self._save = self.node.create_client(SaveMemory, f"{node_name}/save_memory")
        self._load = self.node.create_client(LoadMemory, f"{node_name}/load_memory")
        self._stats: MemoryStats | None = None
        self.history: deque[MemoryStats] = deque(maxlen=history)  # every stats message, newest last
        self._stats_cond = threading.Condition()
        self.node.create_subscription(MemoryStats, f"{node_name}/memory_stats", self._on_stats, 10)
        self._executor = SingleThreadedExecutor(context=context)
        self._executor.add_node(self.node)
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        try:
            self._executor.spin()
        except Exception:  # context shut down
            pass

    def _on_stats(self, msg: MemoryStats) -> None:
        with self._stats_cond:
            self._stats = msg
            self.history.append(msg)
            self._stats_cond.notify_all()

    def wait_ready(self, timeout: float = 60.0) -> bool:
        return self._ask.wait_for_service(timeout_sec=timeout) and self._reset.wait_for_service(timeout_sec=timeout)

    def ask(
        self,
        question: str,
        options: list[str] | None = None,
        cameras: list[str] | None = None,
        since_ns: int = 0,
        until_ns: int = 0,
        max_new_tokens: int = 0,
        timeout: float = 120.0,
    ):
        req = AskVideo.Request()
        req.question = question
        req.options = list(options or [])
        req.cameras = list(cameras or [])
        req.since = ns_to_time(since_ns)
        req.until = ns_to_time(until_ns)
        req.max_new_tokens = max_new_tokens
        return self._call(self._ask, req, timeout)

    def reset(self, timeout: float = 60.0):
        return self._call(self._reset, Trigger.Request(), timeout)

    def save_memory(self, name: str = "", path: str = "", timeout: float = 120.0):
        req = SaveMemory.Request()
        req.name, req.path = name, path
        return self._call(self._save, req, timeout)

    def load_memory(self, name: str = "", path: str = "", timeout: float = 120.0):
        req = LoadMemory.Request()
        req.name, req.path = name, path
        return self._call(self._load, req, timeout)

    def _call(self, client, request, timeout: float):
        future = client.call_async(request)
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        if not done.wait(timeout):
            client.remove_pending_request(future)
            raise TimeoutError(f"no response from {client.srv_name} within {timeout} s")
        return future.result()

    @property
    def stats(self) -> MemoryStats | None:
        return self._stats

    def wait_stats(self, predicate, timeout: float = 60.0) -> MemoryStats:
        """Block until a stats message satisfies ``predicate``; raises TimeoutError with the last one seen."""
        deadline = time.monotonic() + timeout
        with self._stats_cond:
            while self._stats is None or not predicate(self._stats):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"memory_stats never satisfied the condition; last: {self._stats}")
                self._stats_cond.wait(left)
            return self._stats

    def close(self) -> None:
        self._executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()
