"""``ros/goal_calls.py`` over real DDS: a goal whose response does not come in time is still answered by its id.

The server here is a plain rclpy ActionServer in this process whose goal callback holds the
goal response back (as a response lost in discovery looks to the client: none arrives), so the
client presumes the goal accepted and asks for its result by id; a goal the server refused
answers that with STATUS_UNKNOWN, which the client names instead of waiting.
"""

from __future__ import annotations

import threading
import time

import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from action_msgs.msg import GoalStatus  # noqa: E402
from rclpy.action import ActionClient, ActionServer, GoalResponse  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.node import Node  # noqa: E402
from videokv_interfaces.action import LongReplay  # noqa: E402
from videokv_interfaces.msg import ReplayQuestion  # noqa: E402

from videokv_node.ros.goal_calls import GoalCall, lost_goal  # noqa: E402

ACTION = "/goal_calls_it/act"


class Side:
    """A node spun by its own single-threaded executor on a daemon thread."""

    def __init__(self, ctx, name: str) -> None:
        self.node = Node(name, context=ctx)
        self.executor = SingleThreadedExecutor(context=ctx)
        self.executor.add_node(self.node)
        threading.Thread(target=self._spin, daemon=True).start()

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except Exception:  # context shut down
            pass

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=1.0)
        self.node.destroy_node()


@pytest.fixture(scope="module")
def sides(ros):
    """The server holds a goal's response for the seconds its first question names, then accepts
    it unless that question is "refuse"; a kept goal succeeds with its question as the message."""
    _, ctx = ros
    server, client = Side(ctx, "goal_calls_server"), Side(ctx, "goal_calls_client")

    def on_goal(goal) -> GoalResponse:
        question = goal.questions[0].question
        if question.replace(".", "", 1).isdigit():
            time.sleep(float(question))
        return GoalResponse.REJECT if question == "refuse" else GoalResponse.ACCEPT

    def execute(handle):
        handle.publish_feedback(LongReplay.Feedback(phase="encoding"))
        handle.succeed()
        return LongReplay.Result(success=True, message=handle.request.questions[0].question)

    action_server = ActionServer(server.node, LongReplay, ACTION, execute_callback=execute, goal_callback=on_goal)
    action_client = ActionClient(client.node, LongReplay, ACTION)
    assert action_client.wait_for_server(timeout_sec=60)
    yield client, action_client
    action_client.destroy()
    action_server.destroy()
    client.close()
    server.close()


def call(sides, question: str, response_s: float):
    client, action_client = sides
    box, done, feedback = {}, threading.Event(), []

    def on_handle(handle):
        box["handle"] = handle
        if not handle.accepted:
            done.set()
            return
        handle.get_result_async().add_done_callback(lambda fut: (box.update(result=fut.result()), done.set()))

    goal = LongReplay.Goal(questions=[ReplayQuestion(question=question)])
    goal_call = GoalCall(client.executor, action_client, LongReplay, goal, on_handle,
                         feedback_callback=lambda m: feedback.append(m.feedback.phase), response_s=response_s)
    assert goal_call.wait_handle(30) and done.wait(30)
    return goal_call, box, feedback


def test_a_goal_answered_in_time_gets_the_servers_handle(sides):
    goal_call, box, _ = call(sides, "plain", response_s=10.0)
    assert not goal_call.presumed and box["handle"].accepted
    assert box["result"].status == GoalStatus.STATUS_SUCCEEDED and box["result"].result.message == "plain"
    assert not lost_goal(box["result"].status)


def test_a_goal_response_that_does_not_come_is_presumed_and_the_result_asked_by_id(sides):
    goal_call, box, feedback = call(sides, "1.5", response_s=0.3)  # the response comes 1.5 s late
    assert goal_call.presumed and box["handle"].goal_id == goal_call.goal_id
    assert box["result"].status == GoalStatus.STATUS_SUCCEEDED and box["result"].result.message == "1.5"
    deadline = time.monotonic() + 5
    while not feedback and time.monotonic() < deadline:  # feedback is routed by goal id, handle or not
        time.sleep(0.05)
    assert feedback == ["encoding"]


def test_a_refused_goal_whose_refusal_came_late_reads_as_lost(sides):
    goal_call, box, _ = call(sides, "refuse", response_s=0.0)  # presumed before the server even looked
    assert goal_call.presumed
    assert box["result"].status == GoalStatus.STATUS_UNKNOWN and lost_goal(box["result"].status)
