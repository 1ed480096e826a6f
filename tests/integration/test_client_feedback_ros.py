"""``MemoryClient.ask_stream`` keeps feedback that reaches it together with the result, over real DDS.

rclpy's ``ActionClient`` drops a goal's feedback callback as soon as the goal's result
arrives; a client whose executor was busy when the server finished (a loaded machine, a
planner's other callbacks) then loses every feedback message still queued. Here a stand-in
``~/ask`` action server in this process publishes five feedback messages and the result while
the client's (single-threaded) executor is held busy, so all six wait in DDS together; the
client must still return all five, in order. With the feedback read through
``ActionClient``'s callback this test lost four of them.
"""

from __future__ import annotations

import threading
import time

import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from action_msgs.msg import GoalStatus  # noqa: E402
from rclpy.action import ActionServer  # noqa: E402
from rclpy.callback_groups import ReentrantCallbackGroup  # noqa: E402
from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from rclpy.node import Node  # noqa: E402
from videokv_interfaces.action import AskVideo as AskVideoAction  # noqa: E402

from videokv_node.programs.client import MemoryClient  # noqa: E402

TOKENS = ["a", "ab", "abc", "abcd", "abcde"]


def test_feedback_queued_with_the_result_is_kept(ros):
    _, ctx = ros
    started, release = threading.Event(), threading.Event()

    def execute(goal_handle):
        started.set()
        assert release.wait(30), "the test never released the server"
        for i, text in enumerate(TOKENS, 1):
            goal_handle.publish_feedback(AskVideoAction.Feedback(text_so_far=text, tokens=i))
        goal_handle.succeed()
        return AskVideoAction.Result(success=True, answer=TOKENS[-1], option_index=-1)

    server_node = Node("fake_videokv", context=ctx)
    server = ActionServer(server_node, AskVideoAction, "/fake_videokv/ask", execute_callback=execute,
                          callback_group=ReentrantCallbackGroup())
    executor = MultiThreadedExecutor(num_threads=2, context=ctx)
    executor.add_node(server_node)
    spin = threading.Thread(target=executor.spin, daemon=True)
    spin.start()
    client = MemoryClient(node_name="/fake_videokv", context=ctx, client_name="feedback_client")
    try:
        assert client.wait_action_ready(timeout=30)
        out = {}
        asker = threading.Thread(target=lambda: out.update(streamed=client.ask_stream("What happened?", timeout=60)))
        asker.start()
        assert started.wait(30), "the goal never reached the server"
        time.sleep(1.0)  # the client's result request goes out right after the goal is accepted
        # Hold the client's executor, let the server publish everything, then let the client see it all at once.
        busy = client._executor.create_task(lambda: (release.set(), time.sleep(1.5)))
        asker.join(60)
        assert busy.done() and not asker.is_alive()
        streamed = out["streamed"]
        assert streamed.status == GoalStatus.STATUS_SUCCEEDED and streamed.result.answer == TOKENS[-1]
        assert streamed.feedback == TOKENS
    finally:
        release.set()
        client.close()
        executor.shutdown(timeout_sec=1.0)
        spin.join(10)
        server.destroy()
        server_node.destroy_node()
