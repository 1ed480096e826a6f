"""``~/ask``, as a service and as an action (videokv_interfaces AskVideo): one answering path.

Both surfaces take the same request fields and fill the same result fields, so ``answer``
serves both: the Spava long-replay forwarding first (``ros/long_replay_client.py``: a
question reaching before what memory still holds), else the question on the model
worker, with every refusal (a bad request, a full queue, an inactive node, a timeout,
whatever the model raised) success=false with the reason and the memory untouched. The
action adds only what an action has: the answer streamed as feedback per token, a
client's cancel (generation stops at the next token), and the goal's final state.
"""

from __future__ import annotations

import enum
import threading
import time
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout
from typing import cast

from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.node import Node
from videokv_interfaces.action import AskVideo as AskVideoAction
from videokv_interfaces.srv import AskVideo

from videokv_node.memory.question import RequestError
from videokv_node.ros import conversions
from videokv_node.ros.node_host import NodeHost
from videokv_node.runtime.worker import WorkerBusy, WorkerStopped
from videokv_node.view.markers import EvidenceMark

CANCEL_POLL_S = 0.05  # how often a queued goal looks for a cancel request


class Outcome(enum.Enum):
    """How ``answer`` left the result."""

    ANSWERED = "answered"  # success (counted as answered)
    REFUSED = "refused"  # success=false with the reason (counted as failed)
    CANCELED = "canceled"  # the client canceled the goal: nothing filled, not counted as a failed question


class _Cancelled(Exception):
    """Raised from ``on_token`` to stop a goal's generation early (canceled or timed out)."""


class AskSurfaces:
    """The node's ``~/ask`` service and ``~/ask`` action; ``node`` is the videokv node (its worker, engine,
    settings and long-replay client, read per question: a deactivation clears them)."""

    def __init__(self, node: NodeHost, callback_group) -> None:
        self._node = node
        self._service = node.create_service(AskVideo, "~/ask", self.ask_callback, callback_group=callback_group)
        # Actions have their own name space (<name>/_action/...): no clash with the ~/ask service.
        self._action = ActionServer(  # the one use of the node as the rclpy Node it is
            cast(Node, node), AskVideoAction, "~/ask", execute_callback=self.ask_execute_callback,
            goal_callback=self.ask_goal_callback, cancel_callback=self.ask_cancel_callback,
            callback_group=callback_group,
        )

    def destroy(self) -> None:
        """Remove the action server and the service (the node is deactivated)."""
        self._action.destroy()
        self._node.destroy_service(self._service)

    # --- the one answering path ------------------------------------------------
    def answer(self, request, response, wait, on_token=None, canceled=lambda: False) -> Outcome:
        """Answer ``request`` into ``response`` (AskVideo response or action result: the same fields).

        ``wait(future)`` returns the worker's answer or raises (FutureTimeout on timeout);
        ``on_token(text_so_far)`` sees each generated token and may raise ``_Cancelled``;
        ``canceled()`` says whether a stop came from the client (CANCELED) rather than the
        timeout (REFUSED with the reason).
        """
        node = self._node
        handled, note = self._ask_long_replay(request, response)
        if handled:
            return Outcome.ANSWERED if response.success else Outcome.REFUSED
        timed_out = f"no answer within question_timeout_s ({node.settings.node.question_timeout_s} s)"
        future = None
        try:
            question = conversions.request_to_question(request, node.resolve_camera)
            future = node.active_worker().ask(question, on_token=on_token)
            answer = wait(future)
        except (_Cancelled, CancelledError):
            if canceled():  # a client's choice: not counted as a failed question
                return Outcome.CANCELED
            return self._refuse(response, timed_out)  # stopped by the timeout, not by the client
        except (RequestError, WorkerBusy, WorkerStopped) as exc:
            return self._refuse(response, str(exc))
        except FutureTimeout:
            if future is not None:
                future.cancel()
            return self._refuse(response, timed_out)
        except Exception as exc:  # the node keeps running whatever the model raised
            node.get_logger().error(f"question failed: {exc!r}")
            return self._refuse(response, f"internal error: {exc}")
        node.counters.add("answered")
        conversions.fill_response(response, answer)
        response.message = note
        view = node.view
        if view is not None:  # the answer on the map: its evidence, oldest first, labelled with its text
            view.answer_markers(answer.text.strip(), [EvidenceMark(i, e.stamp_ns, e.pose) for i, e in enumerate(answer.evidence)])
        return Outcome.ANSWERED

    def _ask_long_replay(self, request, response) -> tuple[bool, str]:
        """(True, "") if the Spava service answered into ``response``; else (False, a note for ``message``)."""
        node = self._node
        long_replay, engine = node.long_replay, node.engine  # locals: a deactivation may clear them meanwhile
        if long_replay is None or engine is None or not long_replay.wants(request, engine.stats().oldest_stamp_ns):
            return False, ""
        handled, note = long_replay.try_answer(request, response, node.resolve_camera,
                                               node.settings.generation.answer.option_scoring)
        if handled:
            node.counters.add("answered" if response.success else "failed")
        return handled, note

    def _refuse(self, response, message: str) -> Outcome:
        """success=false with the reason, counted as a failed question."""
        self._node.counters.add("failed")
        response.success = False
        response.message = message
        response.option_index = -1
        return Outcome.REFUSED

    # --- the service --------------------------------------------------------------
    def ask_callback(self, request, response):
        """Answer from memory; any refusal is success=false with the reason, the memory untouched."""
        timeout_s = self._node.settings.node.question_timeout_s
        self.answer(request, response, wait=lambda future: future.result(timeout=timeout_s))
        return response

    # --- the action: the answer streamed as feedback, cancellable ------------------
    def ask_goal_callback(self, goal) -> GoalResponse:
        """Reject a goal while max_pending_questions are already waiting; check everything else when it runs."""
        node = self._node
        worker = node.worker
        if worker is None or worker.busy:
            node.counters.add("failed")
            node.get_logger().warn(
                "ask goal rejected: " + ("the node is being deactivated" if worker is None else
                                         f"{worker.pending_jobs} requests already waiting (max_pending_questions)"),
                throttle_duration_sec=node.WARN_THROTTLE_S,
            )
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def ask_cancel_callback(self, goal_handle) -> CancelResponse:
        """Accept every cancel request: generation stops at the next token."""
        return CancelResponse.ACCEPT

    def ask_execute_callback(self, goal_handle):
        """Answer like ``~/ask``, publishing ``text_so_far`` per token; a refusal is success=false with the reason."""
        result = AskVideoAction.Result()
        stop = threading.Event()  # set on timeout: the running generation ends at its next token
        tokens = 0

        def on_token(text_so_far: str) -> None:
            nonlocal tokens
            if stop.is_set() or goal_handle.is_cancel_requested:
                raise _Cancelled()
            tokens += 1
            goal_handle.publish_feedback(AskVideoAction.Feedback(text_so_far=text_so_far, tokens=tokens))

        outcome = self.answer(goal_handle.request, result, wait=lambda future: self._wait_goal(goal_handle, future, stop),
                              on_token=on_token, canceled=lambda: goal_handle.is_cancel_requested)
        if outcome is Outcome.ANSWERED:
            goal_handle.succeed()
        elif outcome is Outcome.CANCELED:
            goal_handle.canceled()
            result.success, result.message, result.option_index = False, f"canceled after {tokens} tokens", -1
        else:
            goal_handle.abort()
        return result

    def _wait_goal(self, goal_handle, future, stop: threading.Event):
        """The future's answer; a goal canceled while still queued leaves the queue at once."""
        deadline = time.monotonic() + self._node.settings.node.question_timeout_s
        while True:
            if goal_handle.is_cancel_requested and future.cancel():
                raise CancelledError()
            left = deadline - time.monotonic()
            if left <= 0:
                stop.set()
                future.cancel()
                raise FutureTimeout()
            try:
                return future.result(timeout=min(CANCEL_POLL_S, left))
            except FutureTimeout:
                continue
