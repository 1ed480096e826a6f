"""The videokv ROS 2 node: cameras in, questions answered from the memory of what they saw.

A thin adapter over the library: callbacks convert messages and hand work to
the ``ModelWorker``; no callback ever runs the model. Camera callbacks share one
mutually exclusive group; the services, the ``~/ask`` action and the stats timer
have their own groups, so a question is accepted while frames keep arriving, on a
MultiThreadedExecutor.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout

import rclpy
import torch
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy, qos_profile_sensor_data, qos_profile_system_default
from rcl_interfaces.msg import SetParametersResult
from sensor_msgs.msg import CompressedImage, Image
from std_srvs.srv import Trigger
from videokv_interfaces.action import AskVideo as AskVideoAction
from videokv_interfaces.msg import MemoryStats
from videokv_interfaces.srv import AskVideo, LoadMemory, SaveMemory

from videokv_node.ingest.image_decode import ImageDecodeError
from videokv_node.ingest.sampler import FrameSampler, SampleDecision
from videokv_node.memory.config import ConfigError
from videokv_node.memory.engine import VideoMemoryEngine
from videokv_node.memory.snapshot import SnapshotError, load_snapshot, resolve_snapshot_path, save_snapshot
from videokv_node.memory.question import Frame, RequestError
from videokv_node.models.factory import ModelLoadError, load_adapter
from videokv_node.ros import conversions
from videokv_node.ros.diagnostics import DiagnosticsPublisher
from videokv_node.ros.long_replay_client import LongReplayClient
from videokv_node.ros.params import Settings, declare_and_read, settings_with
from videokv_node.runtime.worker import ModelWorker, WorkerBusy, WorkerStopped

QOS = {
    "sensor_data": qos_profile_sensor_data,
    "reliable": QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE),
    "system_default": qos_profile_system_default,
}
WARN_THROTTLE_S = 5.0
CANCEL_POLL_S = 0.05  # how often a queued goal looks for a cancel request


class _Cancelled(Exception):
    """Raised from ``on_token`` to stop a goal's generation early (canceled or timed out)."""


class VideoKVNode(Node):
    """Subscribes to cameras, keeps the bounded KV memory, serves ``~/ask`` (service and
    streaming action), ``~/reset``, ``~/save_memory`` and ``~/load_memory``."""

    def __init__(self, **kwargs) -> None:
        super().__init__("videokv", **kwargs)
        self.settings: Settings = declare_and_read(self)
        s = self.settings.node
        log = self.get_logger()
        if s.torch_threads > 0:
            torch.set_num_threads(s.torch_threads)
        log.info(f"loading model {s.model!r} on device {s.device!r}")
        adapter = load_adapter(s.model, device=s.device, dtype=s.dtype, seed=s.seed)
        self.engine = VideoMemoryEngine(adapter, self.settings.memory, self.settings.generation)
        self.worker = ModelWorker(
            self.engine, s.queue_size, s.max_pending_questions, on_ingest_error=self._ingest_error
        )
        self.sampler = FrameSampler(self.settings.sampler)
        self._restore_on_start()
        self._counters = dict(received=0, sampled=0, dropped=0, answered=0, failed=0)
        self._lock = threading.Lock()

        camera_group = MutuallyExclusiveCallbackGroup()
        qos = QOS[s.camera_qos]
        if s.camera_qos_depth > 0:
            qos = QoSProfile(history=qos.history, depth=s.camera_qos_depth, reliability=qos.reliability,
                             durability=qos.durability)
        self._camera_subscriptions = []
        for topic in dict.fromkeys(s.image_topics + s.compressed_topics):
            compressed = topic in s.compressed_topics or topic.endswith("/compressed")
            msg_type = CompressedImage if compressed else Image
            camera = self.resolve_topic_name(topic)
            sub = self.create_subscription(
                msg_type, topic, lambda msg, c=camera, z=compressed: self.image_callback(msg, c, z),
                qos, callback_group=camera_group,
            )
            self._camera_subscriptions.append(sub)
            log.info(f"camera {camera} ({msg_type.__name__}, qos {s.camera_qos})")

        service_group = ReentrantCallbackGroup()
        self.create_service(AskVideo, "~/ask", self.ask_callback, callback_group=service_group)
        self.create_service(Trigger, "~/reset", self.reset_callback, callback_group=service_group)
        self.create_service(SaveMemory, "~/save_memory", self.save_callback, callback_group=service_group)
        self.create_service(LoadMemory, "~/load_memory", self.load_callback, callback_group=service_group)
        # Actions have their own name space (<name>/_action/...): no clash with the ~/ask service.
        self._ask_action = ActionServer(
            self, AskVideoAction, "~/ask", execute_callback=self.ask_execute_callback,
            goal_callback=self.ask_goal_callback, cancel_callback=self.ask_cancel_callback,
            callback_group=service_group,
        )
        # Spava long replay (ros/long_replay_client.py): None unless spava.enabled.
        self._long_replay = LongReplayClient(self, self.settings.spava) if self.settings.spava.enabled else None
        self._stats_pub = self.create_publisher(MemoryStats, "~/memory_stats", 10)
        self.create_timer(s.stats_period_s, self.stats_callback, callback_group=MutuallyExclusiveCallbackGroup())
        self.add_on_set_parameters_callback(self.parameters_callback)
        self._diagnostics = DiagnosticsPublisher(self)
        self.create_timer(s.diagnostics_period_s, self.diagnostics_callback, callback_group=MutuallyExclusiveCallbackGroup())
        mem = self.settings.memory
        log.info(
            f"ready: policy {mem.policy}, {adapter.tokens_per_frame} tokens/frame, budget {mem.budget_tokens} tokens "
            f"resident + {self.engine.stats().budget_offload_bytes} bytes offload, sample_fps {self.settings.sampler.sample_fps}"
        )

    # --- cameras ----------------------------------------------------------
    def image_callback(self, msg, camera: str, compressed: bool) -> None:
        """Decode, sample by header stamp, queue for the model worker; never runs the model.

        Decoding comes first so that a malformed frame is always counted and never
        takes a sample slot; for raw images it is one copy, for JPEG it is the cost
        of that guarantee.
        """
        self._count("received")
        self._diagnostics.frame_received(camera)
        try:
            rgb = conversions.compressed_to_rgb(msg) if compressed else conversions.image_to_rgb(msg)
        except ImageDecodeError as exc:
            self._drop(f"dropped a frame from {camera} ({exc.reason}): {exc}")
            return
        stamp_ns = conversions.time_to_ns(msg.header.stamp)
        if stamp_ns == 0:  # unstamped driver: fall back to the node clock (sim time aware)
            stamp_ns = self.get_clock().now().nanoseconds
        decision = self.sampler.offer(camera, stamp_ns)
        if decision is SampleDecision.STALE:
            self._drop(f"dropped a frame from {camera}: stamp older than the last sampled one")
            return
        if not decision.admitted:
            return
        if decision is SampleDecision.RESET:
            self.get_logger().warn(f"{camera}: stamps jumped back in time, treating it as a clock reset")
        self._count("sampled")
        if self._long_replay is not None:
            self._long_replay.archive.add(camera, stamp_ns, rgb)
        if not self.worker.submit_frame(Frame(camera, stamp_ns, rgb)):
            self._drop("frame queue full: dropped the oldest frame (model slower than sample_fps)")

    def _ingest_error(self, exc: Exception) -> None:
        self._drop(f"the model failed on a frame: {exc!r}")

    # --- services ---------------------------------------------------------
    def ask_callback(self, request, response):
        """Answer from memory; any refusal is success=false with the reason, the memory untouched."""
        handled, note = self._ask_long_replay(request, response)
        if handled:
            return response
        try:
            question = conversions.request_to_question(request, self._resolve_camera)
            future = self.worker.ask(question)
            answer = future.result(timeout=self.settings.node.question_timeout_s)
        except (RequestError, WorkerBusy, WorkerStopped) as exc:
            return self._refuse(response, str(exc))
        except FutureTimeout:
            future.cancel()
            return self._refuse(response, f"no answer within question_timeout_s ({self.settings.node.question_timeout_s} s)")
        except Exception as exc:  # the node keeps running whatever the model raised
            self.get_logger().error(f"question failed: {exc!r}")
            return self._refuse(response, f"internal error: {exc}")
        self._count("answered")
        response = conversions.fill_response(response, answer)
        response.message = note
        return response

    def _ask_long_replay(self, request, response) -> tuple[bool, str]:
        """(True, "") if the Spava service answered into ``response``; else (False, a note for ``message``)."""
        if self._long_replay is None or not self._long_replay.wants(request, self.engine.stats().oldest_stamp_ns):
            return False, ""
        handled, note = self._long_replay.try_answer(request, response, self._resolve_camera)
        if handled:
            self._count("answered" if response.success else "failed")
        return handled, note

    # --- the ~/ask action: the answer streamed as feedback, cancellable ----------
    def ask_goal_callback(self, goal) -> GoalResponse:
        """Reject a goal while max_pending_questions are already waiting; check everything else when it runs."""
        if self.worker.busy:
            self._count("failed")
            self.get_logger().warn(
                f"ask goal rejected: {self.worker.pending_jobs} requests already waiting (max_pending_questions)",
                throttle_duration_sec=WARN_THROTTLE_S,
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
        handled, note = self._ask_long_replay(goal_handle.request, result)
        if handled:
            if result.success:
                goal_handle.succeed()
            else:
                goal_handle.abort()
            return result

        def on_token(text_so_far: str) -> None:
            nonlocal tokens
            if stop.is_set() or goal_handle.is_cancel_requested:
                raise _Cancelled()
            tokens += 1
            goal_handle.publish_feedback(AskVideoAction.Feedback(text_so_far=text_so_far, tokens=tokens))

        try:
            question = conversions.request_to_question(goal_handle.request, self._resolve_camera)
            future = self.worker.ask(question, on_token=on_token)
            answer = self._wait_goal(goal_handle, future, stop)
        except (_Cancelled, CancelledError):
            if not goal_handle.is_cancel_requested:  # stopped by the timeout, not by the client
                goal_handle.abort()
                return self._refuse(result, f"no answer within question_timeout_s ({self.settings.node.question_timeout_s} s)")
            goal_handle.canceled()  # a client's choice: not counted as a failed question
            result.success, result.message, result.option_index = False, f"canceled after {tokens} tokens", -1
            return result
        except (RequestError, WorkerBusy, WorkerStopped) as exc:
            goal_handle.abort()
            return self._refuse(result, str(exc))
        except FutureTimeout:
            goal_handle.abort()
            return self._refuse(result, f"no answer within question_timeout_s ({self.settings.node.question_timeout_s} s)")
        except Exception as exc:  # the node keeps running whatever the model raised
            self.get_logger().error(f"question failed: {exc!r}")
            goal_handle.abort()
            return self._refuse(result, f"internal error: {exc}")
        self._count("answered")
        goal_handle.succeed()
        result = conversions.fill_response(result, answer)
        result.message = note
        return result

    def _wait_goal(self, goal_handle, future, stop: threading.Event):
        """The future's answer; a goal canceled while still queued leaves the queue at once."""
        deadline = time.monotonic() + self.settings.node.question_timeout_s
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

    def reset_callback(self, request, response):
        """Forget every frame (queued ones too)."""
        try:
            self.worker.reset().result(timeout=self.settings.node.question_timeout_s)
            self.sampler.reset()
        except (WorkerBusy, WorkerStopped, FutureTimeout) as exc:
            response.success, response.message = False, f"reset not done: {exc or 'timeout'}"
            return response
        self.get_logger().info("memory reset")
        response.success, response.message = True, "memory cleared"
        return response

    def save_callback(self, request, response):
        """Write the memory to a snapshot inside memory.snapshot_dir, between two frames."""
        try:
            target = resolve_snapshot_path(self.settings.memory.snapshot_dir, request.name, request.path)
            info = self.worker.call(lambda: save_snapshot(self.engine, target)).result(
                timeout=self.settings.node.question_timeout_s
            )
        except (SnapshotError, WorkerBusy, WorkerStopped, FutureTimeout, OSError) as exc:
            response.success, response.message = False, f"memory not saved: {exc or 'timeout'}"
            return response
        self.get_logger().info(f"memory saved to {info.path} ({info.blocks} blocks, {info.bytes} bytes)")
        response.success, response.message = True, f"saved {info.blocks} blocks"
        response.path, response.blocks, response.frames_ingested, response.bytes = str(info.path), info.blocks, info.frames_ingested, info.bytes
        return response

    def load_callback(self, request, response):
        """Replace the memory with a snapshot; a refused snapshot leaves the memory as it was."""
        try:
            target = resolve_snapshot_path(self.settings.memory.snapshot_dir, request.name, request.path)
            info = self.worker.call(lambda: self._load(target)).result(timeout=self.settings.node.question_timeout_s)
        except (SnapshotError, WorkerBusy, WorkerStopped, FutureTimeout, OSError) as exc:
            response.success, response.message = False, f"memory not loaded: {exc or 'timeout'}"
            return response
        self.get_logger().info(f"memory loaded from {info.path} ({info.blocks} blocks)")
        response.success, response.message = True, f"loaded {info.blocks} blocks"
        response.path, response.blocks, response.frames_ingested = str(info.path), info.blocks, info.frames_ingested
        return response

    def _load(self, target):
        """On the worker thread: load, then let frames newer than the snapshot's be sampled again."""
        info = load_snapshot(self.engine, target)
        self.sampler.reset()
        return info

    def _restore_on_start(self) -> None:
        """Load ``memory.restore_on_start`` if it exists; a missing or refused snapshot starts empty, logged."""
        mem = self.settings.memory
        if not mem.restore_on_start:
            return
        log = self.get_logger()
        try:
            target = resolve_snapshot_path(mem.snapshot_dir, name=mem.restore_on_start)
            if not target.exists():
                leftovers = sorted(p.name for p in target.parent.glob(f".{target.name}.*"))
                if leftovers:  # a save was interrupted between its two renames: a complete copy is there
                    log.error(f"snapshot {target} is missing but an interrupted save left {leftovers}: "
                              f"rename the complete one to {target.name} to restore it; starting with an empty memory")
                else:
                    log.info(f"no snapshot {target} yet: starting with an empty memory")
                return
            info = load_snapshot(self.engine, target)
        except (SnapshotError, OSError) as exc:
            log.error(f"snapshot {mem.restore_on_start!r} not restored, starting with an empty memory: {exc}")
            return
        log.info(f"memory restored from {info.path}: {info.blocks} blocks, {info.frames_ingested} frames ingested")

    def _snapshot_on_shutdown(self) -> None:
        mem = self.settings.memory
        if not mem.snapshot_on_shutdown:
            return
        try:
            info = save_snapshot(self.engine, resolve_snapshot_path(mem.snapshot_dir, name=mem.snapshot_on_shutdown))
            self.get_logger().info(f"memory saved to {info.path} on shutdown ({info.blocks} blocks)")
        except (SnapshotError, OSError) as exc:
            self.get_logger().error(f"memory not saved on shutdown: {exc}")

    def stats_callback(self) -> None:
        """Publish ~/memory_stats (node clock, so it follows use_sim_time)."""
        msg = MemoryStats()
        msg.header.stamp = self.get_clock().now().to_msg()
        with self._lock:
            counters = dict(self._counters)
        s = self.settings.node
        conversions.fill_stats(msg, self.engine.stats(), counters, self.worker.queue_depth, s.model, str(self.engine.adapter.device))
        self._stats_pub.publish(msg)

    def diagnostics_callback(self) -> None:
        """Publish /diagnostics: per-camera rate and silence, ingest, memory fill, model."""
        with self._lock:
            counters = dict(self._counters)
        self._diagnostics.publish(counters)

    # --- run-time parameters (params.RUNTIME) -------------------------------
    def parameters_callback(self, params) -> SetParametersResult:
        """Check the whole new configuration as at start, then apply it; a refusal gives the reason, nothing changed."""
        try:
            new = settings_with(self, params)
            if (new.memory, new.generation) != (self.settings.memory, self.settings.generation):
                self.engine.check_budget(new.memory)  # refuse here, with the reason, before queueing anything
                self._on_worker(lambda: self.engine.reconfigure(new.memory, new.generation))
        except (ConfigError, WorkerBusy, WorkerStopped) as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        self.sampler.set_config(new.sampler)
        self.settings = new
        self.get_logger().info("parameters set: " + ", ".join(f"{p.name}={p.value}" for p in params))
        return SetParametersResult(successful=True)

    def _on_worker(self, run):
        """Run on the model thread, between two frames; still queued after question_timeout_s: WorkerBusy."""
        future = self.worker.call(run)
        try:
            return future.result(timeout=self.settings.node.question_timeout_s)
        except FutureTimeout:
            if future.cancel():
                raise WorkerBusy(f"the model stayed busy for question_timeout_s ({self.settings.node.question_timeout_s} s)") from None
            return future.result()  # already running: it is quick

    # --- helpers ----------------------------------------------------------
    def _resolve_camera(self, name: str) -> str:
        try:
            return self.resolve_topic_name(name)
        except Exception:  # an invalid topic name matches no camera; the engine says so
            return name

    def _refuse(self, response, message: str):
        """success=false with the reason, on an AskVideo response or action result (same fields)."""
        self._count("failed")
        response.success = False
        response.message = message
        response.option_index = -1
        return response

    def _count(self, key: str) -> None:
        with self._lock:
            self._counters[key] += 1

    def _drop(self, message: str) -> None:
        self._count("dropped")
        self.get_logger().warn(message, throttle_duration_sec=WARN_THROTTLE_S)

    def destroy_node(self) -> None:
        """Join the worker, snapshot the memory if configured, and release device memory before the node goes."""
        self.worker.stop()
        self._snapshot_on_shutdown()  # the worker has stopped: nothing else touches the engine
        self.engine.close()
        super().destroy_node()


def main(args=None) -> int:
    rclpy.init(args=args)
    node = None
    code = 0
    try:
        node = VideoKVNode()
        executor = MultiThreadedExecutor(num_threads=4 + node.settings.node.max_pending_questions)
        executor.add_node(node)
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except (ConfigError, ModelLoadError) as exc:
        rclpy.logging.get_logger("videokv").fatal(f"cannot start: {exc}")
        code = 1
    finally:
        # A second Ctrl-C must not interrupt the cleanup half-way (the worker join is bounded).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
