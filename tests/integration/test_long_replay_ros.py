"""The Spava long-replay service over real DDS: a 2-rank gloo torchrun job, this process as its client.

Checks the LongReplay action end to end (frames sent in the goal, two questions,
feedback, timings), that its answers equal the single-process oracle's, that a
bad goal is refused with a reason and the next goal still runs, and the node's
forwarding: a long_replay question goes to the service and its answer comes back
through ~/ask; with no service the node answers from memory and says so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest
import torch

rclpy = pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from rclpy.action import ActionClient  # noqa: E402
from rclpy.executors import SingleThreadedExecutor  # noqa: E402
from rclpy.node import Node  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from sensor_msgs.msg import Image  # noqa: E402
from videokv_interfaces.action import LongReplay  # noqa: E402
from videokv_interfaces.msg import ReplayQuestion  # noqa: E402
from videokv_interfaces.srv import AskVideo  # noqa: E402

from tests.unit.spava_jobs import free_port  # noqa: E402
from videokv_node.ros.conversions import ns_to_time, time_to_ns  # noqa: E402
from videokv_node.programs.launcher import NodeProcess  # noqa: E402
from videokv_node.programs.synthetic_camera import image_msg  # noqa: E402
from videokv_node.ros.goal_calls import GoalCall, lost_goal  # noqa: E402

NS = 1_000_000_000
ACTION = "/spava_it/long_replay"
SPAVA_ARGS = ["--anchor-len", "8", "--passing-len", "4", "--pool-window", "3", "--timeout-s", "60", "--max-new-tokens", "3"]


def frame(seed: int, h: int = 24, w: int = 32) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


@contextmanager
def spava_service(env: dict, world: int = 2, max_restarts: int = 0, action: str = ACTION):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(world), "--master-addr", "127.0.0.1",
           "--max-restarts", str(max_restarts),
           "--master-port", str(free_port()), "-m", "videokv_node.programs.long_replay", "--model", "tiny", "--action", action,
           "--torch-threads", "1", *SPAVA_ARGS]
    log = open(env["SPAVA_LOG"], "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        proc.send_signal(2)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        print(open(env["SPAVA_LOG"]).read())  # every incarnation of every rank (shown when a test fails)


class ReplayClient:
    def __init__(self, ctx, action: str = ACTION) -> None:
        self.node = Node("spava_it_client", context=ctx)
        self.client = ActionClient(self.node, LongReplay, action)
        self.executor = SingleThreadedExecutor(context=ctx)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _spin(self):
        try:
            self.executor.spin()
        except Exception:  # context shut down
            pass

    def run(self, goal, timeout: float = 180.0, cancel: bool = False):
        """Send, (cancel,) and get the result, every action call on the executor's thread (see LongReplayClient)."""
        feedback, box, done = [], {}, threading.Event()

        def on_result(fut):
            box["result"] = fut.result()
            done.set()

        def on_goal(handle):
            box["handle"] = handle
            if not handle.accepted:
                done.set()
                return
            if cancel:
                handle.cancel_goal_async()
            handle.get_result_async().add_done_callback(on_result)

        # A goal response lost in discovery (CI, 2026-11-29) gives a presumed handle: the result is asked by id.
        call = GoalCall(self.executor, self.client, LongReplay, goal, on_goal,
                        feedback_callback=lambda m: feedback.append(m.feedback))
        if not (call.wait_handle(timeout) and done.wait(timeout)):
            return None, None, feedback  # e.g. a goal sent to a server that has just died
        if not box["handle"].accepted:
            return None, None, feedback
        if lost_goal(box["result"].status):  # e.g. sent to a rank group that restarted before it kept the goal
            return None, box["result"].status, feedback
        return box["result"].result, box["result"].status, feedback

    def close(self):
        self.executor.shutdown()
        self.node.destroy_node()


def replay_goal(frames, stamps, questions) -> LongReplay.Goal:
    goal = LongReplay.Goal()
    for rgb, t in zip(frames, stamps):
        goal.frames.append(image_msg(rgb, t))
        goal.frame_cameras.append("/cam")
    for q, options, *scoring in questions:
        goal.questions.append(ReplayQuestion(question=q, options=options, option_scoring="".join(scoring)))
    return goal


def oracle_option_scores(frames, question: str, options: list[str], world: int, scoring: str = "letter") -> list[float]:
    """What the service must answer, from the single-process Spava oracle on the same tiny model.

    likelihood: a fresh oracle prefill of the open question per option, its tokens decoded one by
    one, the mean log-probability over the tokens not shared by all options at their start or end
    (found here by comparing the token lists), softmax (written out here, not the runner's loop).
    """
    from videokv_node.models.llava_onevision import LlavaOnevisionAdapter
    from videokv_node.spava.attention import use_spava_attention
    from videokv_node.spava.config import SpavaConfig
    from videokv_node.spava.runner import OracleRunner

    a = LlavaOnevisionAdapter.tiny(seed=0)
    use_spava_attention(a.model.config.text_config)
    video = a.encode_frames(frames).reshape(1, -1, a.model.config.text_config.hidden_size)
    q_ids = a.question_ids(question, [] if scoring == "likelihood" else options)
    embeds = torch.cat([a.embed_tokens(a.prefix_ids()), video, a.embed_tokens(q_ids)], dim=1)

    def runner():
        return OracleRunner(a.model.model.language_model, a.model.lm_head, SpavaConfig(anchor_len=8, passing_len=4, pool_window=3), world)

    with torch.inference_mode():
        if scoring == "letter":
            logits = runner().prefill(embeds, len(q_ids))
            return torch.softmax(logits[a.option_token_ids(len(options))], 0).tolist()
        toks = [a.text_ids(option) for option in options]
        start = end = 0
        while all(len(t) > start + 1 for t in toks) and len({t[start] for t in toks}) == 1:
            start += 1
        while all(len(t) - end - 1 > start for t in toks) and len({t[len(t) - end - 1] for t in toks}) == 1:
            end += 1
        means = []
        for tokens in toks:
            r = runner()
            logits, lps = r.prefill(embeds, len(q_ids)), []
            for token in tokens:
                lps.append(float(torch.log_softmax(logits.double(), 0)[token]))
                logits = r.decode(a.embed_tokens([token]))
            means.append(sum(lps[start:len(lps) - end]) / (len(lps) - end - start))
    return torch.softmax(torch.tensor(means, dtype=torch.float64), 0).tolist()


def test_long_replay_action_and_node_forwarding_over_dds(ros, tmp_path):
    env, ctx = ros
    env = dict(env, SPAVA_LOG=str(tmp_path / "spava.log"))
    frames = [frame(i) for i in range(5)]
    stamps = [(10 + i) * NS for i in range(5)]
    with spava_service(env) as service:
        client = ReplayClient(ctx)
        try:
            assert client.client.wait_for_server(timeout_sec=180), open(env["SPAVA_LOG"]).read()
            goal = replay_goal(frames, stamps, [("What is in the video?", []), ("Which colour?", ["red", "blue"], "letter"),
                                                ("Which colour is it?", ["a dark red one", "a blue one", "a green one"])])
            result, status, feedback = client.run(goal)
            assert result is not None and result.success, result and result.message
            assert result.world_size == 2 and result.frames == 5 and len(result.answers) == 3
            open_q, choice, likely = result.answers
            assert open_q.success and open_q.option_index == -1
            assert [time_to_ns(t) for t in open_q.evidence_stamps] == stamps and set(open_q.evidence_cameras) == {"/cam"}
            assert choice.success and choice.answer == ["red", "blue"][choice.option_index]
            np.testing.assert_allclose(choice.option_scores, oracle_option_scores(frames, "Which colour?", ["red", "blue"], 2),
                                       atol=1e-4)
            # An empty option_scoring is the default, likelihood: scored on the two ranks' shards.
            options = ["a dark red one", "a blue one", "a green one"]  # "a " and " one" shared: left out of the means
            assert likely.success and likely.answer == options[likely.option_index]
            np.testing.assert_allclose(likely.option_scores,
                                       oracle_option_scores(frames, "Which colour is it?", options, 2, "likelihood"), atol=1e-4)
            assert result.prefill_s > 0 and result.total_s >= result.encode_s + result.prefill_s
            phases = [f.phase for f in feedback]
            # feedback is a topic: the last messages may trail the result, so no exact last value
            assert {"encoding", "prefill"} <= set(phases) and max(f.questions_done for f in feedback) >= 1
            assert any(0 < f.prefill_progress < 1 for f in feedback)

            bad = replay_goal(frames, stamps, [])  # no question: refused with the reason, service stays up
            result, _, _ = client.run(bad)
            assert not result.success and "question" in result.message

            windowed = replay_goal(frames, stamps, [("Late?", ["yes", "no"])])
            windowed.questions[0].since = ns_to_time(12 * NS)
            result, _, _ = client.run(windowed)
            assert result.success, result.message
            assert [time_to_ns(t) for t in result.answers[0].evidence_stamps] == stamps[2:]

            from tests.unit.test_spava_bag import write_bag

            bag_goal = replay_goal([], [], [("In the bag?", ["yes", "no"])])
            bag_goal.bag_path, bag_goal.topics, bag_goal.sample_fps = write_bag(tmp_path / "bag"), ["/cam"], 0.5
            result, _, _ = client.run(bag_goal)
            assert result.success, result.message
            assert [time_to_ns(t) for t in result.answers[0].evidence_stamps] == [10 * NS, 12 * NS, 14 * NS]
            assert set(result.answers[0].evidence_cameras) == {"/cam"}

            many = replay_goal(frames, stamps, [(f"Question {i}?", []) for i in range(20)])
            result, status, _ = client.run(many, cancel=True)
            assert not result.success and result.message == "canceled" and status == 5  # GoalStatus.STATUS_CANCELED
        finally:
            client.close()
        _node_forwarding(env, ctx, frames, stamps)
        assert service.poll() is None, "the service died"


def _node_forwarding(env, ctx, frames, stamps):
    """The node forwards a long_replay question with its archived frames and returns the service's answer."""
    params = {"model": "tiny", "image_topics": ["cam"], "camera_qos": "reliable", "camera_qos_depth": 50,
              "sample_fps": 0.0, "queue_size": 16, "max_new_tokens": 3,
              "spava.enabled": True, "spava.action": ACTION, "spava.wait_s": 20.0}
    proc = NodeProcess(params, env, node_name="spava_node")
    peer = Node("spava_node_peer", context=ctx)
    ex = SingleThreadedExecutor(context=ctx)
    ex.add_node(peer)
    try:
        ask = peer.create_client(AskVideo, "/spava_node/ask")
        assert ask.wait_for_service(timeout_sec=120), proc.output()
        pub = peer.create_publisher(Image, "/cam", QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE))
        deadline = time.monotonic() + 20
        while pub.get_subscription_count() == 0:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1.0)
        for rgb, t in zip(frames, stamps):
            pub.publish(image_msg(rgb, t))
            time.sleep(0.05)
        time.sleep(3.0)  # frames sampled and archived
        req = AskVideo.Request(question="Which colour?", options=["red", "blue"], long_replay=True)
        fut = ask.call_async(req)
        ex.spin_until_future_complete(fut, timeout_sec=180)
        resp = fut.result()
        assert resp is not None and resp.success, resp and resp.message
        assert "long-replay service" in resp.message and "2 ranks" in resp.message
        assert [time_to_ns(t) for t in resp.evidence_stamps] == stamps
    finally:
        ex.shutdown()
        peer.destroy_node()
        code = proc.stop()
        print(proc.output()[-3000:])
    assert code == 0, proc.output()


def test_node_answers_from_memory_when_the_service_is_absent(ros):
    from videokv_node.ros.long_replay_client import ABSENT_NOTE, LongReplayClient
    from videokv_node.ros.params import SpavaSettings

    _, ctx = ros
    node = Node("spava_absent", context=ctx)
    try:
        client = LongReplayClient(node, SpavaSettings(enabled=True, action="/nobody/long_replay", wait_s=0.5))
        req = AskVideo.Request(question="Anything?", long_replay=True)
        assert client.wants(req, oldest_in_memory_ns=5 * NS)
        assert client.try_answer(req, AskVideo.Response(), lambda c: c) == (False, ABSENT_NOTE)
        late = AskVideo.Request(question="Anything?", since=ns_to_time(9 * NS))
        assert client.wants(late, oldest_in_memory_ns=10 * NS) and not client.wants(late, oldest_in_memory_ns=8 * NS)
    finally:
        node.destroy_node()


def _worker_pid(torchrun_pid: int, rank: int) -> int:
    """The pid of one rank of the torchrun job (a child of the agent with RANK=<rank> in its environment)."""
    children = subprocess.run(["pgrep", "-P", str(torchrun_pid)], capture_output=True, text=True).stdout.split()
    for pid in children:
        with open(f"/proc/{pid}/environ", "rb") as f:
            if f"RANK={rank}".encode() in f.read().split(b"\0"):
                return int(pid)
    raise AssertionError(f"no rank {rank} among {children}")


def test_the_service_comes_back_after_a_rank_dies(ros, tmp_path):
    """A rank killed: torchrun (--max-restarts) restarts the group and the action answers the next goal."""
    env, ctx = ros
    env = dict(env, SPAVA_LOG=str(tmp_path / "spava.log"))
    goal = replay_goal([frame(i) for i in range(3)], [(10 + i) * NS for i in range(3)], [("Which?", ["a", "b"])])
    # An action name of its own: the earlier tests' service, on the same name in this module's
    # domain, may still be discovered while it shuts down, and wait_for_server would then
    # return before this job's ranks even exist (seen in CI: no rank among torchrun's children).
    action = ACTION + "_restart"
    with spava_service(env, max_restarts=3, action=action) as service:  # docs/SPAVA.md runs 3
        client = ReplayClient(ctx, action=action)
        try:
            assert client.client.wait_for_server(timeout_sec=180), open(env["SPAVA_LOG"]).read()
            os.kill(_worker_pid(service.pid, 1), signal.SIGKILL)
            deadline = time.monotonic() + 240
            result = None
            while result is None or not result.success:
                assert time.monotonic() < deadline, "the service did not come back:\n" + open(env["SPAVA_LOG"]).read()[-3000:]
                time.sleep(2.0)
                if client.client.wait_for_server(timeout_sec=5):
                    result, _, _ = client.run(goal, timeout=20)
            assert result.world_size == 2 and len(result.answers) == 1
        finally:
            client.close()
        assert service.poll() is None
