"""The node's side of the Spava long-replay service: a frame archive and the forwarding of questions.

Choice (issue 5, "frames the node sends"): the node keeps the frames it sampled
into memory in a bounded in-RAM archive (``ingest/frame_archive.py``), JPEG-compressed (at most
``spava.archive_bytes``, oldest dropped first; ``~/memory_stats`` reports its bytes): a 384 px frame is ~20 KB, so the
default 40 MiB holds about 2,000 frames, over an hour at 0.5 fps, where their KV would cost
gigabytes. A cap in bytes, not frames, because a JPEG's size follows the camera's resolution
and the scene. A question
whose window starts before the oldest frame still in memory (or whose request
sets ``long_replay``) is sent with the archived frames of its window, evenly
thinned to ``spava.max_send_frames`` (a goal is one DDS message). Bags are the
service's other source (a goal with ``bag_path``), for replays the node never saw.
If the service is absent the node answers from its own memory and says so in
``message``.
"""

from __future__ import annotations

import threading
import time

from rclpy.action import ActionClient
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node
from sensor_msgs.msg import Image

from videokv_interfaces.action import LongReplay
from videokv_interfaces.msg import ReplayQuestion

from videokv_node.ingest.frame_archive import FrameArchive
from videokv_node.ingest.image_decode import encode_raw_image
from videokv_node.memory.config import DEFAULT_OPTION_SCORING
from videokv_node.ros.conversions import ns_to_time, pose_to_msg, time_to_ns
from videokv_node.ros.goal_calls import LOST_GOAL_NOTE, GoalCall, lost_goal
from videokv_node.ros.params import SpavaSettings

ABSENT_NOTE = "long-replay service absent: answered from the node's own memory"


class LongReplayClient:
    """Decides which questions go to the service and forwards them; one per node.

    The action client lives on a node and a single-threaded executor of its own:
    rclpy's ActionClient registers a request only after sending it, so a response
    handled by another executor thread in between is dropped ("Ignoring unexpected
    result response"). Here every send runs as a task of that one thread.
    """

    def __init__(self, node: Node, settings: SpavaSettings) -> None:
        self._s = settings
        self.archive = FrameArchive(settings.archive_bytes, settings.archive_quality)
        self._node = Node(f"{node.get_name()}_long_replay", namespace=node.get_namespace(), context=node.context)
        self._client = ActionClient(self._node, LongReplay, settings.action)
        self._executor = SingleThreadedExecutor(context=node.context)
        self._executor.add_node(self._node)
        threading.Thread(target=self._spin, daemon=True, name="long_replay_client").start()

    def _spin(self) -> None:
        try:
            self._executor.spin()
        except (ExternalShutdownException, RuntimeError):  # the context shut down with the node
            pass

    def close(self) -> None:
        """Stop the client's executor and destroy its node (the node's deactivate or shutdown)."""
        self._executor.shutdown(timeout_sec=1.0)
        self._client.destroy()
        self._node.destroy_node()

    def wants(self, request, oldest_in_memory_ns: int) -> bool:
        """Forward if asked to, or if the window starts before what memory still holds."""
        since = time_to_ns(request.since)
        return bool(getattr(request, "long_replay", False)) or (since > 0 and (oldest_in_memory_ns == 0 or since < oldest_in_memory_ns))

    def try_answer(self, request, response, resolve_camera, option_scoring: str = DEFAULT_OPTION_SCORING) -> tuple[bool, str]:
        """Fill ``response`` (AskVideo response or action result) from the service.

        ``option_scoring`` (the node's ``answer.option_scoring``) goes with the question, so a
        multiple-choice answer is scored the same way by the service as from memory.

        Returns (True, "") when the response is filled (success or a failure with
        its reason), or (False, note) when the node should answer from memory
        and put ``note`` in ``message`` (service absent).
        """
        if not self._client.wait_for_server(timeout_sec=self._s.wait_s):
            return False, ABSENT_NOTE
        cameras = [resolve_camera(c) for c in request.cameras if c]
        frames = self.archive.window(time_to_ns(request.since), time_to_ns(request.until), cameras, self._s.max_send_frames)
        if not frames:
            return False, "no archived frame in the question's window for the long-replay service: answered from memory"
        goal = LongReplay.Goal(questions=[ReplayQuestion(
            question=request.question, options=list(request.options), cameras=cameras,
            since=request.since, until=request.until, max_new_tokens=request.max_new_tokens,
            option_scoring=option_scoring)])
        for camera, stamp, rgb, _ in frames:
            msg = Image(**encode_raw_image(rgb, "rgb8"))
            msg.header.stamp = ns_to_time(stamp)
            goal.frames.append(msg)
            goal.frame_cameras.append(camera)
        if any(pose is not None for *_, pose in frames):  # poses travel with the frames, cited back in evidence_poses
            goal.frame_poses = [pose_to_msg(pose, stamp) for _, stamp, _, pose in frames]
        result = self._run(goal)
        if isinstance(result, str):
            response.success, response.message, response.option_index = False, result, -1
            return True, ""
        if not result.success or not result.answers:
            response.success, response.message, response.option_index = False, f"long replay failed: {result.message}", -1
            return True, ""
        a = result.answers[0]
        response.success, response.message = a.success, a.message or f"answered by the long-replay service ({len(frames)} frames, {result.world_size} ranks)"
        response.answer, response.option_index, response.option_scores = a.answer, a.option_index, list(a.option_scores)
        response.evidence_stamps, response.evidence_cameras = list(a.evidence_stamps), list(a.evidence_cameras)
        response.evidence_poses = list(a.evidence_poses)
        response.evidence_last_stamps, response.evidence_last_poses = list(a.evidence_stamps), list(a.evidence_poses)  # no spans in a replay
        response.ttft_s, response.total_s = a.ttft_s, a.total_s
        return True, ""

    def _run(self, goal):
        """The action's result, or a string saying why there is none. Blocks this (executor) thread only.

        A goal response lost in discovery (``ros/goal_calls.py``) does not hang the question: the
        result is asked by the goal's id.
        """
        done = threading.Event()
        box: dict = {}

        def on_result(fut):
            response = fut.result()
            if lost_goal(response.status):
                box["error"] = f"long replay failed: {LOST_GOAL_NOTE}"
            else:
                box["result"] = response.result
            done.set()

        def on_goal(handle):
            if not handle.accepted:
                box["error"] = "the long-replay service rejected the question (busy)"
                done.set()
                return
            box["handle"] = handle
            handle.get_result_async().add_done_callback(on_result)

        deadline = time.monotonic() + self._s.timeout_s
        call = GoalCall(self._executor, self._client, LongReplay, goal, on_goal)
        if not (call.wait_handle(self._s.timeout_s) and done.wait(max(0.0, deadline - time.monotonic()))):
            if "handle" in box:
                self._executor.create_task(box["handle"].cancel_goal_async)
            return f"no answer from the long-replay service within spava.timeout_s ({self._s.timeout_s} s)"
        return box.get("error") or box["result"]
