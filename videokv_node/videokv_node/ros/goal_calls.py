"""Sending an action goal whose goal response may be lost in discovery.

Why: Fast DDS (rmw_fastrtps) drops a service response when the server has not yet matched
the client's response reader ("failed to send response (timeout): client will not receive
response", after the response writer's ``max_blocking_time``, 100 ms by default). A client's
``wait_for_server`` returns once the client has matched the server's endpoints, not once the
server has matched the client's, so on a loaded machine the first goal sent right after it
can be accepted, executed and never announced: a client that waits for the goal response
waits forever (seen in CI on 2026-11-29: a LongReplay goal on a 2-core runner). The goal
*request* is not lost the same way: the client's request writer is matched with the server's
reader before the server counts as available.

What is guaranteed: a `GoalCall` hands its ``on_handle`` exactly one handle per goal, on the
executor's thread: the server's, from the goal response, or, when none came within
``response_s``, one presumed accepted for the same goal id. ``get_result_async`` on either asks
the server for the goal's result by that id (rcl_action's get_result service), so a goal that
ran is answered as if its response had come; a goal the server never kept (lost, or refused
with its refusal lost) is answered at once with ``STATUS_UNKNOWN``, which `lost_goal` names, so
a caller reports it instead of waiting. Feedback needs no handle: it is routed by goal id.
"""

from __future__ import annotations

import threading
import uuid
from typing import Callable

from action_msgs.msg import GoalStatus
from rclpy.action.client import ActionClient, ClientGoalHandle
from rclpy.executors import Executor
from unique_identifier_msgs.msg import UUID

GOAL_RESPONSE_S = 5.0  # a goal response comes within milliseconds when the endpoints are matched
LOST_GOAL_NOTE = "the action server does not know the goal (its goal response was lost and it never ran, or it was refused)"


def lost_goal(status: int) -> bool:
    """True for a result response about a goal the server does not hold (rcl_action answers STATUS_UNKNOWN)."""
    return status == GoalStatus.STATUS_UNKNOWN


class GoalCall:
    """One goal, sent on ``executor``'s thread; its handle reaches ``on_handle`` once.

    rclpy's ActionClient registers a request's future only after sending it, so every send
    (the goal here, and the caller's get_result/cancel in ``on_handle``) runs as a task of the
    client's single executor thread, where no response is handled in between.
    """

    def __init__(self, executor: Executor, client: ActionClient, action_type, goal,
                 on_handle: Callable[[ClientGoalHandle], None], feedback_callback=None,
                 response_s: float = GOAL_RESPONSE_S, goal_id: UUID | None = None) -> None:
        self.goal_id = goal_id if goal_id is not None else UUID(uuid=list(uuid.uuid4().bytes))
        self.presumed = False  # True when the handle was presumed, not the server's
        self._executor, self._client, self._action_type = executor, client, action_type
        self._on_handle, self._response_s = on_handle, response_s
        self._handled = False
        self._settled = threading.Event()
        executor.create_task(lambda: client.send_goal_async(goal, feedback_callback=feedback_callback, goal_uuid=self.goal_id)
                             .add_done_callback(lambda fut: self._settle(fut.result(), presumed=False)))

    def _settle(self, handle: ClientGoalHandle, presumed: bool) -> None:
        # Both ways run as tasks of the executor's one thread: no lock needed, and the event is
        # set only once on_handle has returned, so a waiter sees what on_handle recorded.
        if self._handled:
            return  # the other way came first: a late goal response, or a presumption overtaken
        self._handled, self.presumed = True, presumed
        try:
            self._on_handle(handle)
        finally:
            self._settled.set()

    def wait_handle(self, timeout: float) -> bool:
        """Block (not on the executor's thread) until ``on_handle`` has been called; False after ``timeout`` s.

        After ``response_s`` without a goal response the handle is presumed accepted.
        """
        if self._settled.wait(min(self._response_s, timeout)):
            return True
        response = self._action_type.Impl.SendGoalService.Response(accepted=True)
        presumed = ClientGoalHandle(self._client, self.goal_id, response)
        self._executor.create_task(lambda: self._settle(presumed, presumed=True))
        return self._settled.wait(max(0.0, timeout - self._response_s))
