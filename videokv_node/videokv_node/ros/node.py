"""The videokv ROS 2 node: cameras in, questions answered from the memory of what they saw.

A thin adapter over the library: callbacks convert messages and hand work to
the ``ModelWorker``; no callback ever runs the model. Camera callbacks share one
mutually exclusive group; the services, the ``~/ask`` action and the stats timer
have their own groups, so a question is accepted while frames keep arriving, on a
MultiThreadedExecutor.

``VideoKVMixin`` holds the node's work as the steps of a ROS 2 managed node
(configure, activate, deactivate, cleanup, shutdown). ``VideoKVNode`` (plain) runs
configure and activate in its constructor and shutdown when destroyed;
``ros/lifecycle.py``'s ``VideoKVLifecycleNode`` runs each step on its transition.
``main`` starts one or the other by the ``lifecycle`` parameter.
"""

from __future__ import annotations

import gc
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import CancelledError
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path

import rclpy
import torch
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.exceptions import ParameterException
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
from videokv_node.memory.snapshot_series import LATEST, SnapshotSeries
from videokv_node.memory.question import Frame, RequestError
from videokv_node.models.factory import ModelLoadError, load_adapter
from videokv_node.ros import conversions
from videokv_node.ros.diagnostics import DiagnosticsPublisher, health_config
from videokv_node.ros.health import device_memory
from videokv_node.ros.locate_service import LocateService
from videokv_node.ros.long_replay_client import LongReplayClient
from videokv_node.ros.params import Settings, declare_and_read, settings_with
from videokv_node.ros.pose_intake import PoseIntake, check_available
from videokv_node.runtime.periodic_snapshots import PeriodicSnapshotter
from videokv_node.runtime.worker import ModelWorker, WorkerBusy, WorkerStopped
from videokv_node.vision.selection import attach_vision_backend

QOS = {
    "sensor_data": qos_profile_sensor_data,
    "reliable": QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE),
    "system_default": qos_profile_system_default,
}
WARN_THROTTLE_S = 5.0
CANCEL_POLL_S = 0.05  # how often a queued goal looks for a cancel request
# Shutdown waits this long for the question being answered (as before the lifecycle steps), then
# snapshots anyway: engine.ask changes no memory. Deactivation waits for it without a bound,
# because parking closes the engine under it.
SHUTDOWN_JOIN_S = 30.0
NODE_NAME = "videokv"


class _Cancelled(Exception):
    """Raised from ``on_token`` to stop a goal's generation early (canceled or timed out)."""


class VideoKVMixin:
    """The node's work, as the steps of a managed node; mixed into an rclpy ``Node`` or ``LifecycleNode``.

    States and what each holds (the attributes are None where not held):

    - unconfigured: nothing but the declared parameters;
    - configured (inactive): the model (``adapter``), the memory (``engine``, or after a
      deactivation its contents parked on host disk in ``_parked``), the sampler, the counters;
    - active: also the model worker thread and every ROS entity that brings work in or
      answers: camera subscriptions, services, the ``~/ask`` action, publishers and timers.

    Deactivation destroys those entities (so an inactive node ingests nothing and its
    services are gone, not refusing: a client's ``wait_for_service`` says it is not
    there), joins the worker, and frees the memory's device (and host arena) memory by
    parking its whole state as a snapshot in a private temporary directory; activation
    restores it, so deactivate/activate loses nothing. The model's weights stay loaded
    until cleanup. Whatever releases the memory (cleanup, shutdown) writes
    ``memory.snapshot_on_shutdown`` first if it is set.
    """

    def get_logger(self):
        """The node's logger; once the ROS context is shut down (Ctrl-C, SIGTERM) a console-only child of
        it, since rosout can no longer be published to and rclpy would print an error for every line."""
        logger = super().get_logger()
        if self.context.ok():
            return logger
        return rclpy.logging.get_logger(f"{logger.name}.shutdown")

    def _init_steps(self) -> None:
        """Called first by the node's constructor: nothing is held yet."""
        self.settings: Settings | None = None
        self.adapter = None
        self.engine: VideoMemoryEngine | None = None
        self.worker: ModelWorker | None = None
        self.sampler: FrameSampler | None = None
        self._parked: Path | None = None  # snapshot directory of the memory while inactive after a deactivation
        self._io: list = []  # (destroy function, entity) of what activate created
        self._diagnostics: DiagnosticsPublisher | None = None
        self._diagnostics_timer = None
        self._long_replay: LongReplayClient | None = None  # Spava service client while active, if spava.enabled
        self._poses: PoseIntake | None = None  # robot poses while active, if pose_topic or pose_source tf
        self._series: SnapshotSeries | None = None  # periodic snapshots' directory while configured, if snapshot_dir is set
        self._snapshotter: PeriodicSnapshotter | None = None  # while active, if memory.snapshot_period_s > 0
        self._counters = dict(received=0, sampled=0, dropped=0, answered=0, failed=0)
        self._lock = threading.Lock()

    # --- configure: model and memory ---------------------------------------
    def configure_step(self, settings: Settings) -> None:
        """Load the model and build the memory; raises ConfigError or ModelLoadError with nothing held."""
        s = settings.node
        log = self.get_logger()
        check_available(settings.pose)  # before loading the model: tf without tf2_ros cannot work
        if s.torch_threads > 0:
            torch.set_num_threads(s.torch_threads)
        log.info(f"loading model {s.model!r} on device {s.device!r}")
        try:
            self.adapter = load_adapter(s.model, device=s.device, dtype=s.dtype, seed=s.seed)
            # Logs its choice; may build a TensorRT engine (logged before it starts).
            attach_vision_backend(self.adapter, settings.vision, logger=log)
            try:
                self.engine = VideoMemoryEngine(self.adapter, settings.memory, settings.generation)
            except ConfigError:
                raise  # already says which parameter and why
            except ValueError as exc:  # a policy's own check against the model
                raise ConfigError(f"memory.policy {settings.memory.policy} with model {s.model!r}: {exc}") from exc
        except BaseException:
            self.engine = self.adapter = None
            _free_device_memory()
            raise
        for note in self.engine.adaptations:
            log.info(f"adapted to the model: {note}")
        self.settings = settings
        self.sampler = FrameSampler(settings.sampler)
        with self._lock:
            self._counters = dict.fromkeys(self._counters, 0)
        if settings.memory.snapshot_dir:
            self._series = SnapshotSeries(settings.memory.snapshot_dir, settings.memory.snapshot_keep)
        self._restore_on_start()
        mem = settings.memory
        log.info(
            f"configured: policy {mem.policy}, {self.adapter.tokens_per_frame} tokens/frame, budget {mem.budget_tokens} "
            f"tokens resident + {self.engine.stats().budget_offload_bytes} bytes offload, sample_fps {settings.sampler.sample_fps}"
        )

    # --- activate: work in, answers out --------------------------------------
    def activate_step(self) -> None:
        """Bring back a parked memory, start the worker, create subscriptions, services, action and timers.

        A parked memory that cannot be restored raises SnapshotError (or ConfigError for a
        budget set while inactive that does not hold) and stays parked.
        """
        if self._parked is not None:
            self._unpark()
        s = self.settings.node
        log = self.get_logger()
        self.worker = ModelWorker(
            self.engine, s.queue_size, s.max_pending_questions, on_ingest_error=self._ingest_error,
            max_batch=self.settings.vision.max_batch,
        )

        camera_group = MutuallyExclusiveCallbackGroup()
        qos = QOS[s.camera_qos]
        if s.camera_qos_depth > 0:
            qos = QoSProfile(history=qos.history, depth=s.camera_qos_depth, reliability=qos.reliability,
                             durability=qos.durability)
        for topic in dict.fromkeys(s.image_topics + s.compressed_topics):
            compressed = topic in s.compressed_topics or topic.endswith("/compressed")
            msg_type = CompressedImage if compressed else Image
            camera = self.resolve_topic_name(topic)
            self._keep(self.destroy_subscription, self.create_subscription(
                msg_type, topic, lambda msg, c=camera, z=compressed: self.image_callback(msg, c, z),
                qos, callback_group=camera_group,
            ))
            log.info(f"camera {camera} ({msg_type.__name__}, qos {s.camera_qos})")
        if self.settings.pose.enabled:  # ros/pose_intake.py: each sampled frame gets the pose at its stamp
            self._poses = PoseIntake(self, self.settings.pose)
            self._keep(lambda p: p.destroy(), self._poses)

        service_group = ReentrantCallbackGroup()
        for srv_type, name, callback in ((AskVideo, "~/ask", self.ask_callback), (Trigger, "~/reset", self.reset_callback),
                                         (SaveMemory, "~/save_memory", self.save_callback),
                                         (LoadMemory, "~/load_memory", self.load_callback)):
            self._keep(self.destroy_service, self.create_service(srv_type, name, callback, callback_group=service_group))
        self._keep(lambda srv: srv.destroy(), LocateService(self, service_group))  # ~/locate (ros/locate_service.py)
        # Actions have their own name space (<name>/_action/...): no clash with the ~/ask service.
        action = ActionServer(
            self, AskVideoAction, "~/ask", execute_callback=self.ask_execute_callback,
            goal_callback=self.ask_goal_callback, cancel_callback=self.ask_cancel_callback,
            callback_group=service_group,
        )
        self._keep(lambda a: a.destroy(), action)
        # Spava long replay (ros/long_replay_client.py): None unless spava.enabled.
        if self.settings.spava.enabled:
            self._long_replay = LongReplayClient(self, self.settings.spava)
            self._keep(lambda c: c.close(), self._long_replay)
        self._stats_pub = self.create_publisher(MemoryStats, "~/memory_stats", 10)
        self._keep(self.destroy_publisher, self._stats_pub)
        self._keep(self.destroy_timer, self.create_timer(
            s.stats_period_s, self.stats_callback, callback_group=MutuallyExclusiveCallbackGroup()))
        mem = self.settings.memory
        if mem.snapshot_period_s > 0:
            self._snapshotter = PeriodicSnapshotter(self._series, mem.snapshot_period_s, self.get_clock().now().nanoseconds,
                                                    log=self._log_at)
            self._keep(self.destroy_timer, self.create_timer(
                mem.snapshot_period_s, self.snapshot_callback, callback_group=MutuallyExclusiveCallbackGroup()))
            log.info(f"periodic snapshots every {mem.snapshot_period_s} s into {self._series.root}, newest {mem.snapshot_keep} kept")
        self._diagnostics = DiagnosticsPublisher(self)
        self._keep(lambda d: d.destroy(), self._diagnostics)
        self._diagnostics_timer = self.create_timer(
            s.diagnostics_period_s, self.diagnostics_callback, callback_group=MutuallyExclusiveCallbackGroup())
        self._keep(self.destroy_timer, self._diagnostics_timer)
        log.info("active: ingesting frames and answering questions")

    def _keep(self, destroy, entity) -> None:
        self._io.append((destroy, entity))

    # --- deactivate: stop work, free the memory's device memory ---------------
    def deactivate_step(self) -> None:
        """Stop all work, park the memory on host disk and free its device memory; log the figures before and after.

        The engine's own figures (KV resident on the device, the host arena's used and reserved
        bytes) drop to zero with it; on CUDA, torch's allocated and reserved bytes on the device
        are logged too.
        """
        self._stop_work()
        stats = self.engine.stats()
        device = str(self.adapter.device)
        before = device_memory(device)
        info = self._park()
        after = device_memory(device)
        self.get_logger().info(
            f"inactive: memory parked on host disk ({info.blocks} blocks, {info.bytes} bytes in {self._parked}); freed "
            f"KV resident on {device} {stats.bytes_resident} -> 0 bytes, host arena {stats.bytes_offloaded} -> 0 bytes used "
            f"(of {stats.budget_offload_bytes} -> 0 reserved; pinned, so committed, on CUDA)"
            + "".join(f", {k} {before[k]} -> {after[k]}" for k in sorted(before.keys() & after.keys()) if k != "device_memory")
        )

    def _stop_work(self, join_s: float | None = None) -> None:
        """Destroy what activate created (no new callback starts), then join the worker (its queue fails)."""
        io, self._io = self._io, []
        self._long_replay = self._poses = None
        for destroy, entity in reversed(io):
            destroy(entity)
        self._diagnostics = self._diagnostics_timer = None
        if self.worker is not None:
            self.worker.stop(timeout=join_s)
            self.worker = None
        if self._snapshotter is not None:  # after the worker: a snapshot being written is finished, not cut
            self._snapshotter.close(wait=True)
            self._snapshotter = None

    def _park(self):
        """Save the memory to a private temporary directory and close the engine (its device memory goes)."""
        self._parked = Path(tempfile.mkdtemp(prefix="videokv-parked-")) / "memory"
        try:
            info = save_snapshot(self.engine, self._parked)
        except BaseException:
            shutil.rmtree(self._parked.parent, ignore_errors=True)
            self._parked = None
            raise
        self.engine.close()
        self.engine = None
        _free_device_memory()
        return info

    def _unpark(self) -> None:
        """Rebuild the engine from the current settings and load the parked memory into it."""
        engine = VideoMemoryEngine(self.adapter, self.settings.memory, self.settings.generation)
        try:
            info = load_snapshot(engine, self._parked)
        except BaseException:
            engine.close()
            raise
        self.engine = engine
        shutil.rmtree(self._parked.parent, ignore_errors=True)
        self._parked = None
        self.get_logger().info(f"memory restored from parking: {info.blocks} blocks, {self.engine.stats().bytes_resident} bytes resident")

    # --- cleanup and shutdown: release everything -------------------------------
    def cleanup_step(self) -> None:
        """Release the memory (snapshot_on_shutdown first, if set) and the model; back to unconfigured
        (parameters are read again at the next configure)."""
        self._stop_work(join_s=SHUTDOWN_JOIN_S)
        if self._parked is not None and self.settings.memory.snapshot_on_shutdown:
            try:
                self._unpark()  # the shutdown snapshot is written from a live engine, like any other
            except (SnapshotError, ConfigError, OSError) as exc:
                self.get_logger().error(f"parked memory not restored for the shutdown snapshot: {exc}")
        if self.engine is not None:
            self._snapshot_on_shutdown()  # the worker has stopped: nothing else touches the engine
            self.engine.close()
        if self._parked is not None:
            shutil.rmtree(self._parked.parent, ignore_errors=True)
        self.engine = self.adapter = self.sampler = self._parked = self.settings = self._series = None
        _free_device_memory()
        self.get_logger().info("memory and model released")

    def shutdown_step(self) -> None:
        """From any state: stop work, write snapshot_on_shutdown if configured, release everything."""
        if self.adapter is not None:
            self.cleanup_step()

    # --- cameras ----------------------------------------------------------
    def image_callback(self, msg, camera: str, compressed: bool) -> None:
        """Decode, sample by header stamp, queue for the model worker; never runs the model.

        Decoding comes first so that a malformed frame is always counted and never
        takes a sample slot; for raw images it is one copy, for JPEG it is the cost
        of that guarantee.
        """
        worker, diagnostics = self.worker, self._diagnostics
        if worker is None or diagnostics is None:  # delivered just before a deactivation: not taken
            return
        self._count("received")
        diagnostics.frame_received(camera)
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
        poses = self._poses
        pose = poses.pose_at(stamp_ns) if poses is not None else None
        long_replay = self._long_replay
        if long_replay is not None:
            long_replay.archive.add(camera, stamp_ns, rgb, pose)
        try:
            if not worker.submit_frame(Frame(camera, stamp_ns, rgb, pose)):
                self._drop("frame queue full: dropped the oldest frame (model slower than sample_fps)")
        except WorkerStopped:  # deactivated while this frame was on its way
            self._drop(f"dropped a frame from {camera}: the node is being deactivated")

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
            future = self._worker().ask(question)
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
        long_replay, engine = self._long_replay, self.engine  # locals: a deactivation may clear them meanwhile
        if long_replay is None or engine is None or not long_replay.wants(request, engine.stats().oldest_stamp_ns):
            return False, ""
        handled, note = long_replay.try_answer(request, response, self._resolve_camera,
                                               self.settings.generation.answer.option_scoring)
        if handled:
            self._count("answered" if response.success else "failed")
        return handled, note

    # --- the ~/ask action: the answer streamed as feedback, cancellable ----------
    def ask_goal_callback(self, goal) -> GoalResponse:
        """Reject a goal while max_pending_questions are already waiting; check everything else when it runs."""
        worker = self.worker
        if worker is None or worker.busy:
            self._count("failed")
            self.get_logger().warn(
                "ask goal rejected: " + ("the node is being deactivated" if worker is None else
                                         f"{worker.pending_jobs} requests already waiting (max_pending_questions)"),
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
            future = self._worker().ask(question, on_token=on_token)
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
            self._worker().reset().result(timeout=self.settings.node.question_timeout_s)
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
            info = self._worker().call(lambda: save_snapshot(self.engine, target)).result(
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
            info = self._worker().call(lambda: self._load(target)).result(timeout=self.settings.node.question_timeout_s)
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
        """Load ``memory.restore_on_start`` if it exists; a missing or refused snapshot starts empty, logged.

        ``latest``: the newest periodic snapshot that passes every check, older ones after a
        refusal (each refusal logged with its reason), else an empty memory.
        """
        mem = self.settings.memory
        if not mem.restore_on_start:
            return
        log = self.get_logger()
        if mem.restore_on_start == LATEST:
            info, refusals = self._series.restore_latest(self.engine)
            for r in refusals:
                log.error(f"periodic snapshot {r.path.name} refused: {r.reason}")
            if info is None:
                found = "none of the periodic snapshots passed its checks" if refusals else "no periodic snapshot yet"
                log.info(f"{found} in {self._series.root}: starting with an empty memory")
            else:
                log.info(f"memory restored from {info.path}: {info.blocks} blocks, {info.frames_ingested} frames ingested")
            return
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

    def snapshot_callback(self) -> None:
        """memory.snapshot_period_s: start the next periodic snapshot (node clock; written off the model thread)."""
        snapshotter, worker, engine = self._snapshotter, self.worker, self.engine
        if snapshotter is None or worker is None or engine is None:  # fired just before a deactivation
            return
        snapshotter.tick(self.get_clock().now().nanoseconds, worker, engine)

    def _log_at(self, level: str, text: str) -> None:
        """The periodic snapshotter's log lines (from its threads), throttled where they can repeat."""
        log = self.get_logger()
        if level == "debug":
            log.debug(text)
        elif level == "info":
            log.info(text)
        elif level == "warn":
            log.warn(text, throttle_duration_sec=WARN_THROTTLE_S)
        else:
            log.error(text)

    def stats_callback(self) -> None:
        """Publish ~/memory_stats (node clock, so it follows use_sim_time)."""
        engine, worker = self.engine, self.worker
        if engine is None or worker is None:  # fired just before a deactivation
            return
        msg = MemoryStats()
        msg.header.stamp = self.get_clock().now().to_msg()
        with self._lock:
            counters = dict(self._counters)
        s = self.settings.node
        conversions.fill_stats(msg, engine.stats(), counters, worker.queue_depth, s.model, str(engine.adapter.device),
                               vision_backend=engine.adapter.vision_backend.name)
        snapshots, long_replay = self._snapshotter, self._long_replay
        if snapshots is not None:
            status = snapshots.status(self.get_clock().now().nanoseconds)
            msg.last_snapshot_stamp = conversions.ns_to_time(status.last_good_ns)
            msg.snapshots_failed = status.failed
        msg.spava_archive_bytes = long_replay.archive.bytes if long_replay is not None else 0
        self._stats_pub.publish(msg)

    def diagnostics_callback(self) -> None:
        """Publish /diagnostics: per-camera rate and silence, ingest, memory fill, model."""
        diagnostics, engine, worker = self._diagnostics, self.engine, self.worker
        if diagnostics is None or engine is None or worker is None:  # fired just before a deactivation
            return
        with self._lock:
            counters = dict(self._counters)
        snapshots = self._snapshotter
        diagnostics.publish(counters, engine, worker, snapshots=snapshots, poses=self._poses)

    # --- run-time parameters (params.RUNTIME) -------------------------------
    def parameters_callback(self, params) -> SetParametersResult:
        """Check the whole new configuration as at start, then apply it; a refusal gives the reason, nothing changed.

        Unconfigured (lifecycle node): every change is taken as it is; configure reads and
        checks the whole configuration. Inactive with the memory parked: checked here, the
        memory's new budget applies when activate rebuilds the engine.
        """
        if self.settings is None:
            return SetParametersResult(successful=True)
        try:
            new = settings_with(self, params)
            if self.engine is not None and (new.memory, new.generation) != (self.settings.memory, self.settings.generation):
                self.engine.check_budget(new.memory)  # refuse here, with the reason, before queueing anything
                engine = self.engine
                apply = lambda: engine.reconfigure(new.memory, new.generation)  # noqa: E731
                self._on_worker(apply) if self.worker is not None else apply()
        except (ConfigError, WorkerBusy, WorkerStopped) as exc:
            return SetParametersResult(successful=False, reason=str(exc))
        self.sampler.set_config(new.sampler)
        if self._diagnostics is not None:  # active: new thresholds from the next report, the new period from the next tick
            self._diagnostics.monitor.set_config(health_config(new.node))
            if new.node.diagnostics_period_s != self.settings.node.diagnostics_period_s:
                self._diagnostics_timer.timer_period_ns = int(new.node.diagnostics_period_s * 1e9)
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
    def _worker(self) -> ModelWorker:
        """The running worker; WorkerStopped (a refusal with the reason) for a request that raced a deactivation."""
        worker = self.worker
        if worker is None:
            raise WorkerStopped("the node is not active")
        return worker

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



class VideoKVNode(VideoKVMixin, Node):
    """The plain node: configured and active from construction to destruction.

    Subscribes to cameras (and a robot pose topic), keeps the bounded KV memory, serves
    ``~/ask`` (service and streaming action), ``~/locate``, ``~/reset``, ``~/save_memory``
    and ``~/load_memory``.
    """

    def __init__(self, **kwargs) -> None:
        super().__init__(NODE_NAME, **kwargs)
        self._init_steps()
        self.configure_step(declare_and_read(self))
        self.activate_step()
        self.add_on_set_parameters_callback(self.parameters_callback)

    def destroy_node(self) -> None:
        """Join the worker, snapshot the memory if configured, and release device memory before the node goes."""
        self.shutdown_step()
        super().destroy_node()


def _free_device_memory() -> None:
    """Return freed tensors' device memory to the driver, so the figures (and other processes) see it."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def wants_lifecycle() -> bool:
    """The ``lifecycle`` parameter (command line or params file), read before the node is made.

    A short-lived node of the same name reads it, so remapping and params files apply
    as to the real node; it has no parameter services and no rosout.
    """
    probe = Node(NODE_NAME, start_parameter_services=False, enable_rosout=False)
    try:
        return bool(probe.declare_parameter("lifecycle", False).value)
    except ParameterException as exc:
        raise ConfigError(str(exc)) from exc
    finally:
        probe.destroy_node()


def make_node() -> Node:
    """The plain node, or the lifecycle node (unconfigured) when the ``lifecycle`` parameter is true."""
    if wants_lifecycle():
        from videokv_node.ros.lifecycle import VideoKVLifecycleNode

        return VideoKVLifecycleNode()
    return VideoKVNode()


def main(args=None) -> int:
    rclpy.init(args=args)
    node = None
    code = 0
    try:
        node = make_node()
        # The lifecycle node may be unconfigured: the parameter is declared, its settings not yet read.
        executor = MultiThreadedExecutor(num_threads=4 + node.get_parameter("max_pending_questions").value)
        executor.add_node(node)
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except (ConfigError, ModelLoadError) as exc:
        rclpy.logging.get_logger(NODE_NAME).fatal(f"cannot start: {exc}")
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
