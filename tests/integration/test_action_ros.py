"""The ``~/ask`` action over real DDS: the answer streamed as feedback, cancellable, refusals with a reason.

One node process for the whole module (the ``ros`` fixture gives it its own DDS domain).
"""

from __future__ import annotations

import time

import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from action_msgs.msg import GoalStatus  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402

from tests.integration.test_node_ros import NS, RELIABLE, frame, running_node, wait_subscribed  # noqa: E402
from videokv_node.programs.synthetic_camera import image_msg  # noqa: E402

PARAMS = {
    "model": "tiny",
    "image_topics": ["cam_a"],
    "camera_qos": "reliable",
    "camera_qos_depth": 200,  # the node's history holds a burst on a loaded machine
    "sample_fps": 0.0,
    "queue_size": 64,
    "stats_period_s": 0.2,
    "memory.policy": "rekv",
    "memory.budget_tokens": 1024,
    "memory.local_window_tokens": 32,
    "memory.retrieve_frames": 2,
    "memory.max_question_tokens": 200,
    "max_new_tokens": 4,
}


def test_ask_action_streams_cancels_and_refuses(ros):
    with running_node(ros, PARAMS, "videokv_action") as (proc, client, cam):
        assert client.wait_action_ready(timeout=60), proc.output()
        pub = cam.create_publisher(Image, "/cam_a", RELIABLE)
        wait_subscribed(pub)
        for i in range(4):
            pub.publish(image_msg(frame(i), (10 + i) * NS))
            time.sleep(0.05)
        client.wait_stats(lambda s: s.frames_ingested == 4 and s.queue_depth == 0, timeout=60)

        # Open question: one feedback per token, the text growing; the result is the last one,
        # and the service gives the same answer (greedy decoding, memory unchanged by questions).
        # The tiny model's tokens are bytes, so one token may add nothing printable (half a UTF-8
        # character): the text grows overall, not at every step.
        streamed = client.ask_stream("What happened?", max_new_tokens=8)
        assert streamed.status == GoalStatus.STATUS_SUCCEEDED and streamed.result.success, streamed.result.message
        texts = streamed.feedback
        assert len(texts) >= 2 and len(texts[-1]) > len(texts[0]), texts
        # The result and the feedback travel on different DDS entities; the client waits after the
        # result for the feedback that holds the whole answer (test_client_feedback_ros).
        assert texts[-1].strip() == streamed.result.answer, (streamed.result.answer, texts)
        assert streamed.result.option_index == -1 and streamed.result.evidence_stamps
        served = client.ask("What happened?", max_new_tokens=8)
        assert served.success and served.answer == streamed.result.answer

        # Multiple choice: one feedback, the chosen option.
        options = ["red", "green", "blue"]
        mc = client.ask_stream("What colour is the box?", options=options)
        assert mc.result.success and mc.status == GoalStatus.STATUS_SUCCEEDED
        assert mc.feedback == [mc.result.answer] and mc.result.answer == options[mc.result.option_index]

        # Canceled after the first token: ends canceled, with fewer tokens than asked for. The goal
        # asks for many tokens so that the cancel's DDS round trip arrives while it still generates:
        # with 64, the random model wrote them all first once in CI (a few ms a token).
        many = 1024  # the node's max_new_tokens_limit (its default)
        canceled = client.ask_stream("What happened?", max_new_tokens=many, cancel_after_tokens=1)
        assert canceled.status == GoalStatus.STATUS_CANCELED, (canceled.status, canceled.result.message)
        assert not canceled.result.success and "canceled" in canceled.result.message
        assert 1 <= len(canceled.feedback) < many

        # Malformed goal: accepted, then refused with the reason; the node keeps answering.
        empty = client.ask_stream("   ")
        assert empty.status == GoalStatus.STATUS_ABORTED
        assert not empty.result.success and "empty" in empty.result.message and not empty.feedback
        again = client.ask_stream("What happened?", max_new_tokens=8)
        assert again.result.success and again.result.answer == streamed.result.answer
