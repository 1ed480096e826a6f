"""A small synchronous client of the videokv node, for the demo, the tests and planners' scripts.

It spins its own executor in a background thread, so calls block the caller
only, and keeps the latest ``~/memory_stats`` message.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from typing import NamedTuple

import rclpy
from action_msgs.msg import GoalStatus
from rclpy.action import ActionClient
from rcl_interfaces.srv import GetParameters
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from unique_identifier_msgs.msg import UUID
from std_srvs.srv import Trigger
from videokv_interfaces.action import AskVideo as AskVideoAction
from videokv_interfaces.msg import MemoryStats
from videokv_interfaces.srv import AskVideo, LoadMemory, Locate, SaveMemory

from videokv_node.ros.conversions import ns_to_time
from videokv_node.ros.goal_calls import LOST_GOAL_NOTE, GoalCall, lost_goal


FEEDBACK_DEPTH = 1000  # feedback messages this client queues per topic before the oldest is dropped
FEEDBACK_QUIET_S = 0.5  # after the result, unless the last feedback is the answer: stop once none came for this long...
FEEDBACK_DRAIN_S = 3.0  # ...or after this long in all


class StreamedAnswer(NamedTuple):
    """What ``ask_stream`` returns: the action's result, every feedback text in order, the goal's final status."""

    result: AskVideoAction.Result  # success=false with the reason when rejected, refused or canceled
    feedback: list[str]  # text_so_far of each feedback message, in arrival order
    status: int  # action_msgs/GoalStatus.STATUS_*; STATUS_UNKNOWN when the goal was rejected


def _fill_question(msg, question, options, cameras, since_ns, until_ns, max_new_tokens):
    """The AskVideo service request and action goal have the same fields."""
    msg.question = question
    msg.options = list(options or [])
    msg.cameras = list(cameras or [])
    msg.since = ns_to_time(since_ns)
    msg.until = ns_to_time(until_ns)
    msg.max_new_tokens = max_new_tokens
    return msg


class MemoryClient:
    """Calls ``<node>/ask`` (service and action), ``<node>/locate``, ``<node>/reset``, ``<node>/save_memory``
    and ``<node>/load_memory`` and watches ``<node>/memory_stats``."""

    def __init__(
        self, node_name: str = "/videokv", context=None, client_name: str = "videokv_client", history: int = 10_000
    ) -> None:
        self.node = Node(client_name, context=context)
        self._ask = self.node.create_client(AskVideo, f"{node_name}/ask")
        self._reset = self.node.create_client(Trigger, f"{node_name}/reset")
        self._save = self.node.create_client(SaveMemory, f"{node_name}/save_memory")
        self._load = self.node.create_client(LoadMemory, f"{node_name}/load_memory")
        self._locate = self.node.create_client(Locate, f"{node_name}/locate")
        self._get_parameters = self.node.create_client(GetParameters, f"{node_name}/get_parameters")
        self._ask_action = ActionClient(self.node, AskVideoAction, f"{node_name}/ask")
        # The action's feedback read by a subscription of our own, not ActionClient's feedback
        # callback: rclpy drops a goal's feedback callback as soon as its result arrives, and the
        # result and feedback travel on different DDS entities, so on a loaded machine feedback
        # published before the result could be lost. Same topic and QoS as rcl_action's
        # (reliable, volatile); a deeper queue, so a slow client drops nothing.
        self._feedback_sinks: dict[bytes, object] = {}  # goal uuid -> callback(feedback message)
        self._feedback_lock = threading.Lock()
        self.node.create_subscription(
            AskVideoAction.Impl.FeedbackMessage, f"{node_name}/ask/_action/feedback", self._on_feedback,
            QoSProfile(depth=FEEDBACK_DEPTH, reliability=ReliabilityPolicy.RELIABLE),
        )
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

    def _on_feedback(self, msg) -> None:
        with self._feedback_lock:
            sink = self._feedback_sinks.get(bytes(msg.goal_id.uuid))
        if sink is not None:  # another client's goal, or one this client finished with
            sink(msg.feedback)

    def _on_stats(self, msg: MemoryStats) -> None:
        with self._stats_cond:
            self._stats = msg
            self.history.append(msg)
            self._stats_cond.notify_all()

    def wait_ready(self, timeout: float = 60.0) -> bool:
        return self._ask.wait_for_service(timeout_sec=timeout) and self._reset.wait_for_service(timeout_sec=timeout)

    def wait_action_ready(self, timeout: float = 60.0) -> bool:
        return self._ask_action.wait_for_server(timeout_sec=timeout)

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
        req = _fill_question(AskVideo.Request(), question, options, cameras, since_ns, until_ns, max_new_tokens)
        return self._call(self._ask, req, timeout)

    def ask_stream(
        self,
        question: str,
        options: list[str] | None = None,
        cameras: list[str] | None = None,
        since_ns: int = 0,
        until_ns: int = 0,
        max_new_tokens: int = 0,
        cancel_after_tokens: int = 0,
        timeout: float = 120.0,
    ) -> StreamedAnswer:
        """Ask through the ``~/ask`` action; ``cancel_after_tokens`` > 0 cancels once that many tokens arrived.

        The feedback list holds the goal's feedback messages in order: the feedback published
        before the result can arrive after it, so after the result this waits until a feedback
        message holds the whole answer (its text, stripped, is the result's answer: the node's last
        feedback of a succeeded goal), or else, for a canceled or refused goal, until none came for
        ``FEEDBACK_QUIET_S``; ``FEEDBACK_DRAIN_S`` at most either way.
        """
        goal = _fill_question(AskVideoAction.Goal(), question, options, cameras, since_ns, until_ns, max_new_tokens)
        goal_id = UUID(uuid=list(uuid.uuid4().bytes))
        texts: list[str] = []
        lock = threading.Lock()
        arrived = threading.Condition(lock)
        handle = None  # set once the goal is accepted; feedback may arrive before that
        cancel_wanted = False

        def on_feedback(feedback) -> None:
            nonlocal cancel_wanted
            with lock:
                texts.append(feedback.text_so_far)
                arrived.notify_all()
                if cancel_after_tokens and feedback.tokens >= cancel_after_tokens and not cancel_wanted:
                    cancel_wanted = True
                    if handle is not None:
                        handle.cancel_goal_async()

        key = bytes(goal_id.uuid)
        with self._feedback_lock:
            self._feedback_sinks[key] = on_feedback
        try:
            deadline = time.monotonic() + timeout
            box: dict = {}
            call = GoalCall(self._executor, self._ask_action, AskVideoAction, goal, lambda h: box.update(handle=h), goal_id=goal_id)
            if not call.wait_handle(max(0.0, deadline - time.monotonic())):
                raise TimeoutError("no goal response from the ask action in time")
            goal_handle = box["handle"]  # the server's, or presumed accepted when its response was lost (goal_calls)
            if not goal_handle.accepted:
                rejected = AskVideoAction.Result(success=False, message="goal rejected by the node (too many questions waiting)")
                rejected.option_index = -1
                return StreamedAnswer(rejected, list(texts), GoalStatus.STATUS_UNKNOWN)
            with lock:
                handle = goal_handle
                cancel_now = cancel_wanted  # feedback asked for a cancel before the goal was accepted
            if cancel_now:  # not under the lock: on_feedback takes it on the executor thread this waits for
                self._on_executor(goal_handle.cancel_goal_async, deadline)
            response = self._wait(self._on_executor(goal_handle.get_result_async, deadline), deadline, "result")
            if lost_goal(response.status):
                lost = AskVideoAction.Result(success=False, message=LOST_GOAL_NOTE)
                lost.option_index = -1
                return StreamedAnswer(lost, list(texts), GoalStatus.STATUS_UNKNOWN)
            # The answer the last feedback will hold; None (wait for quiet) when refused, canceled or empty.
            answer = response.result.answer if response.result.success and response.result.answer else None
            drain_end = time.monotonic() + FEEDBACK_DRAIN_S
            with lock:
                while not (answer is not None and texts and texts[-1].strip() == answer):
                    seen = len(texts)
                    left = min(FEEDBACK_DRAIN_S if answer is not None else FEEDBACK_QUIET_S, drain_end - time.monotonic())
                    if left <= 0 or not arrived.wait_for(lambda: len(texts) > seen, left):
                        break
                return StreamedAnswer(response.result, list(texts), response.status)
        finally:
            with self._feedback_lock:
                self._feedback_sinks.pop(key, None)

    def _on_executor(self, send, deadline: float):
        """Run ``send`` (an action request) on the executor's thread and return the future it gives.

        rclpy's ActionClient registers a request's future only after sending the request; a
        response that the executor thread handles in between is dropped ("Ignoring unexpected
        ... response") and the future never completes. Sending from the executor's own
        (single) thread closes that window: no response is handled while ``send`` runs.
        """
        return self._wait(self._executor.create_task(send), deadline, "send on the executor")

    @staticmethod
    def _wait(future, deadline: float, what: str):
        done = threading.Event()
        future.add_done_callback(lambda _: done.set())
        if not done.wait(max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"no {what} from the ask action in time")
        return future.result()

    def locate(self, query: str, top_k: int = 5, cameras: list[str] | None = None, since_ns: int = 0, until_ns: int = 0,
               timeout: float = 120.0):
        """The node's ``~/locate`` response: the top_k moments for ``query`` (success=false with the reason if refused)."""
        req = Locate.Request(query=query, top_k=top_k, cameras=list(cameras or []),
                             since=ns_to_time(since_ns), until=ns_to_time(until_ns))
        return self._call(self._locate, req, timeout)

    def parameter(self, name: str, timeout: float = 30.0):
        """The node's parameter ``name`` as a Python value (as ``ros2 param get`` reads it), or None where the node
        has no such parameter."""
        from rclpy.parameter import parameter_value_to_python

        if not self._get_parameters.wait_for_service(timeout_sec=timeout):
            raise TimeoutError("the node's get_parameters service is not up")
        response = self._call(self._get_parameters, GetParameters.Request(names=[name]), timeout)
        values = list(response.values)
        return parameter_value_to_python(values[0]) if values and values[0].type else None

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

    def close(self, timeout: float = 10.0) -> None:
        """Stop the spin thread, then destroy the node.

        The order matters: destroying entities while the spin thread is still inside the
        executor's wait set races with it in rcl. The spin loop leaves once the executor is
        shut down (its guard condition wakes the wait).
        """
        self._executor.shutdown(timeout_sec=1.0)
        self._thread.join(timeout)
        if self._thread.is_alive():
            print(f"MemoryClient: the spin thread did not stop within {timeout} s", flush=True)
        self._ask_action.destroy()
        self.node.destroy_node()
