"""``torchrun --nproc-per-node N -m videokv_node.programs.long_replay ...``: the Spava long-replay service.

Every rank runs ``spava/server.py`` (options there: ``--help``); rank 0 hosts the
LongReplay action server below.

One goal runs at a time (others are rejected while one runs, as llama_ros does):
the goal's frames are decoded to RGB here, the job goes to every rank through
the dispatcher, feedback is published from rank 0's progress, a cancel request
stops the job at its next checkpoint. A bad goal gets success=false with the
reason; the server keeps running. Bag goals: see ``bag_frames`` below.
"""

from __future__ import annotations

import sys
import threading

import rclpy
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node

from videokv_interfaces.action import LongReplay
from videokv_interfaces.msg import ReplayAnswer as ReplayAnswerMsg

from videokv_node.ingest.image_decode import ImageDecodeError
from videokv_node.memory.config import DEFAULT_OPTION_SCORING
from videokv_node.ros.shutdown import shutdown_context
from videokv_node.ros.conversions import image_to_rgb, msg_to_pose, ns_to_time, pose_to_msg, time_to_ns
from videokv_node.spava import server
from videokv_node.spava.job import Progress, ReplayJob, ReplayOutcome, ReplayQuestion, RunJob


def goal_to_job(goal) -> ReplayJob:
    """LongReplay goal -> ReplayJob; raises ValueError with the reason."""
    if goal.bag_path:
        from videokv_node.programs.long_replay_bag import bag_frames  # the rosbags library only where bags are read

        frames, stamps, cameras = bag_frames(goal.bag_path, list(goal.topics), time_to_ns(goal.since),
                                             time_to_ns(goal.until), float(goal.sample_fps))
    else:
        if goal.frame_cameras and len(goal.frame_cameras) != len(goal.frames):
            raise ValueError(f"{len(goal.frame_cameras)} frame_cameras for {len(goal.frames)} frames")
        try:
            frames = [image_to_rgb(m) for m in goal.frames]
        except ImageDecodeError as exc:
            raise ValueError(f"a frame cannot be decoded: {exc}") from exc
        stamps = [time_to_ns(m.header.stamp) for m in goal.frames]
        cameras = list(goal.frame_cameras) or [""] * len(frames)
    questions = [ReplayQuestion(q.question, tuple(q.options), tuple(q.cameras), time_to_ns(q.since),
                                time_to_ns(q.until), int(q.max_new_tokens), q.option_scoring or DEFAULT_OPTION_SCORING)
                 for q in goal.questions]
    return ReplayJob(frames, stamps, cameras, questions)


def goal_poses(goal) -> dict[tuple[str, int], object]:
    """(camera, stamp) -> pose of the goal's frames sent with ``frame_poses``; raises ValueError if misaligned.

    Bag goals carry none (the bag's odometry is not read: their evidence_poses are all empty)."""
    if goal.bag_path or not goal.frame_poses:
        return {}
    if len(goal.frame_poses) != len(goal.frames):
        raise ValueError(f"{len(goal.frame_poses)} frame_poses for {len(goal.frames)} frames")
    cameras = list(goal.frame_cameras) or [""] * len(goal.frames)
    return {(c, time_to_ns(m.header.stamp)): msg_to_pose(p) for c, m, p in zip(cameras, goal.frames, goal.frame_poses)}


def fill_result(result, outcome: ReplayOutcome, total_s: float, poses: dict | None = None):
    """The action result from the job's outcome; ``poses`` ((camera, stamp) -> pose, ``goal_poses``)
    become each answer's evidence_poses (an empty frame_id where a frame came without one)."""
    poses = poses or {}
    result.success, result.message = outcome.success, outcome.message  # load_s: set by the caller
    result.frames, result.world_size = outcome.frames, outcome.world_size
    result.encode_s, result.prefill_s, result.decode_s = outcome.encode_s, outcome.prefill_s, outcome.decode_s
    result.total_s = total_s
    for a in outcome.answers:
        result.answers.append(ReplayAnswerMsg(
            success=a.success, message=a.message, answer=a.answer, option_index=a.option_index,
            option_scores=a.option_scores, evidence_stamps=[ns_to_time(t) for t in a.evidence_stamps_ns],
            evidence_cameras=a.evidence_cameras, ttft_s=a.ttft_s, total_s=a.total_s,
            evidence_poses=[pose_to_msg(poses.get((c, t)), t) for t, c in zip(a.evidence_stamps_ns, a.evidence_cameras)],
        ))
    return result


class LongReplayServer(Node):
    """Rank 0's ROS face of the Spava job: the ``LongReplay`` action."""

    def __init__(self, run_job: RunJob, world: int, max_frames: int, action: str) -> None:
        super().__init__("videokv_long_replay")
        self._run_job, self._world, self._max_frames = run_job, world, max_frames
        self._busy = threading.Lock()
        self.done = threading.Event()  # set when the job group broke: main() exits so torchrun restarts it
        self._server = ActionServer(
            self, LongReplay, action, execute_callback=self.execute_callback,
            goal_callback=self.goal_callback, cancel_callback=self.cancel_callback,
            callback_group=ReentrantCallbackGroup(),
        )
        self.get_logger().info(f"LongReplay action {action} on a Spava job of {world} ranks")

    def goal_callback(self, goal) -> GoalResponse:
        """Reject a goal while another runs: one prefill across all ranks at a time."""
        if self._busy.locked():
            self.get_logger().warn("long replay goal rejected: a job is running")
            return GoalResponse.REJECT
        return GoalResponse.ACCEPT

    def cancel_callback(self, goal_handle) -> CancelResponse:
        """Accept: the job stops at its next checkpoint (after encoding, before each question)."""
        return CancelResponse.ACCEPT

    def execute_callback(self, goal_handle):
        """Run the job on every rank; publish progress; success=false with the reason on any failure."""
        clock = self.get_clock()
        start = clock.now()
        result = LongReplay.Result(world_size=self._world)
        with self._busy:
            try:
                job = goal_to_job(goal_handle.request)
                job.check(self._max_frames)
                poses = goal_poses(goal_handle.request)
            except (ValueError, OSError) as exc:
                goal_handle.abort()
                result.success, result.message = False, str(exc)
                return result
            result.load_s = (clock.now() - start).nanoseconds / 1e9

            def progress(p: Progress) -> None:
                goal_handle.publish_feedback(LongReplay.Feedback(
                    phase=p.phase, frames_encoded=p.frames_encoded, frames_total=p.frames_total,
                    questions_done=p.questions_done, questions_total=p.questions_total,
                    prefill_progress=p.prefill_progress, eta_s=p.eta_s))

            outcome = self._run_job(job, progress, lambda: goal_handle.is_cancel_requested)
        total_s = (clock.now() - start).nanoseconds / 1e9
        fill_result(result, outcome, total_s, poses)
        if outcome.success:
            goal_handle.succeed()
        elif goal_handle.is_cancel_requested and outcome.message == "canceled":
            goal_handle.canceled()
        else:
            goal_handle.abort()
            if getattr(self._run_job, "broken", False):
                self.get_logger().error(f"{outcome.message}; exiting so torchrun restarts the job group")
                self.done.set()
        return result


def serve(run_job: RunJob, world: int, max_frames: int, action: str) -> None:
    """Spin the action server until shutdown or until the job group broke."""
    rclpy.init()
    node = None
    try:
        node = LongReplayServer(run_job, world, max_frames, action)
        executor = MultiThreadedExecutor(num_threads=4)
        executor.add_node(node)
        while rclpy.ok() and not node.done.is_set():
            executor.spin_once(timeout_sec=0.2)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if node is not None:
            node.destroy_node()
        shutdown_context()


def main(argv: list[str] | None = None) -> int:
    """One rank of the service (under torchrun): spava/server.py with this module's ``serve`` on rank 0."""
    return server.main(argv, serve=serve)


if __name__ == "__main__":
    sys.exit(main())
