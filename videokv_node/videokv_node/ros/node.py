"""The videokv ROS 2 node's wiring: cameras in, questions answered from the memory of what they saw.

A thin adapter over the library: callbacks convert messages and hand work to the
``ModelWorker``; no callback ever runs the model. The node's parts (``camera_intake``, ``ask``,
``locate_service``, ``memory_services``, ``memory_view``, ``snapshots``, ``status``; docs/ARCHITECTURE.md)
are created on activate and destroyed on deactivate, each seeing the node as ``NodeHost``. Services, action
and timers have their own callback groups, so a question is accepted while frames keep arriving.

``VideoKVMixin`` holds the node's work as the steps of a ROS 2 managed node
(configure, activate, deactivate, cleanup, shutdown). ``VideoKVNode`` (plain) runs
configure and activate in its constructor and shutdown when destroyed;
``ros/lifecycle.py``'s ``VideoKVLifecycleNode`` runs each step on its transition.
``ros/main.py``'s ``main`` starts one or the other by the ``lifecycle`` parameter.
"""

from __future__ import annotations

from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, Callable, TypeVar

import rclpy
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.node import Node
from rcl_interfaces.msg import SetParametersResult

from videokv_node.ingest.frame_intake import FrameIntake
from videokv_node.ingest.sampler import FrameSampler
from videokv_node.memory.config import ConfigError
from videokv_node.memory.engine import VideoMemoryEngine
from videokv_node.memory.snapshot.format import SnapshotError
from videokv_node.memory.snapshot.series import SnapshotSeries
from videokv_node.models.adapter import VideoLLMAdapter
from videokv_node.models.factory import load_adapter
from videokv_node.process_settings import apply_process_settings
from videokv_node.ros import snapshots
from videokv_node.ros.ask import AskSurfaces
from videokv_node.ros.camera_intake import CameraIntake, FrameRoute
from videokv_node.runtime.health import device_memory, free_device_memory
from videokv_node.ros.locate_service import LocateService
from videokv_node.ros.long_replay_client import LongReplayClient
from videokv_node.ros.node_host import NodeBase
from videokv_node.ros.memory_services import MemoryServices
from videokv_node.ros.memory_view import MemoryViewPublishers, start_view
from videokv_node.ros.params import Settings, declare_and_read, settings_with
from videokv_node.ros.pose_intake import PoseIntake, check_available
from videokv_node.ros.status import StatusPublishers
from videokv_node.runtime.counters import Counters
from videokv_node.runtime.periodic_snapshots import PeriodicSnapshotter
from videokv_node.runtime.worker import ModelWorker, WorkerBusy, WorkerStopped
from videokv_node.vision.selection import attach_vision_backend

# Shutdown waits this long for the question being answered (as before the lifecycle steps), then
# snapshots anyway: engine.ask changes no memory. Deactivation waits for it without a bound,
# because parking closes the engine under it.
SHUTDOWN_JOIN_S = 30.0
NODE_NAME = "videokv"
T = TypeVar("T")


class VideoKVMixin(NodeBase):
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

    WARN_THROTTLE_S = 5.0  # the least time between two repeats of a warning on a hot path

    @property
    def settings(self) -> Settings:
        """The node's settings while configured (a run-time parameter change replaces them whole); RuntimeError before."""
        return _held(self._settings, "the settings")

    def get_logger(self):
        """The node's logger; once the ROS context is shut down (Ctrl-C, SIGTERM) a console-only child of
        it, since rosout can no longer be published to and rclpy would print an error for every line."""
        logger = super().get_logger()
        if self.context.ok():
            return logger
        return rclpy.logging.get_logger(f"{logger.name}.shutdown")

    def _init_steps(self) -> None:
        """Called first by the node's constructor: nothing is held yet."""
        self._settings: Settings | None = None  # ``settings`` while configured
        self.adapter: VideoLLMAdapter | None = None
        self.engine: VideoMemoryEngine | None = None
        self.worker: ModelWorker | None = None
        self.sampler: FrameSampler | None = None
        self.intake: FrameIntake | None = None  # check -> sample -> decode, per-camera counts; while configured
        self._parked: Path | None = None  # snapshot directory of the memory while inactive after a deactivation
        self._io: list[tuple[Callable[[Any], Any], Any]] = []  # (destroy function, entity) of what activate created
        self.status: StatusPublishers | None = None  # ~/memory_stats and /diagnostics while active
        self.view: MemoryViewPublishers | None = None  # ~/memory_markers, ~/memory_sheet while active, if enabled
        self.long_replay: LongReplayClient | None = None  # Spava service client while active, if spava.enabled
        self.poses: PoseIntake | None = None  # robot poses while active, if pose_topic or pose_source tf
        self._series: SnapshotSeries | None = None  # periodic snapshots' directory while configured, if snapshot_dir is set
        self.snapshotter: PeriodicSnapshotter | None = None  # while active, if memory.snapshot_period_s > 0
        self.counters = Counters()  # frames and questions, for ~/memory_stats and /diagnostics

    # --- configure: model and memory ---------------------------------------
    def configure_step(self, settings: Settings) -> None:
        """Load the model and build the memory; raises ConfigError or ModelLoadError with nothing held."""
        s = settings.node
        log = self.get_logger()
        check_available(settings.pose)  # before loading the model: tf without tf2_ros cannot work
        apply_process_settings(s.torch_threads, s.gil_switch_interval_s)  # process_settings.py: why the interval
        log.info(f"loading model {s.model!r} on device {s.device!r}")
        try:
            self.adapter = adapter = load_adapter(s.model, device=s.device, dtype=s.dtype, seed=s.seed)
            # Logs its choice; may build a TensorRT engine (logged before it starts).
            attach_vision_backend(adapter, settings.vision, logger=log)
            try:
                self.engine = engine = VideoMemoryEngine(adapter, settings.memory, settings.generation)
            except ConfigError:
                raise  # already says which parameter and why
            except ValueError as exc:  # a policy's own check against the model
                raise ConfigError(f"memory.policy {settings.memory.policy} with model {s.model!r}: {exc}") from exc
        except BaseException:
            self.engine = self.adapter = None
            free_device_memory()
            raise
        for note in engine.adaptations:
            log.info(f"adapted to the model: {note}")
        self._settings = settings
        self.sampler = sampler = FrameSampler(settings.sampler)
        self.intake = FrameIntake(sampler)
        self.counters.reset()
        if settings.memory.snapshot_dir:
            self._series = SnapshotSeries(settings.memory.snapshot_dir, settings.memory.snapshot_keep)
        snapshots.restore_on_start(engine, settings.memory, self._series, log)
        mem = settings.memory
        log.info(
            f"configured: policy {mem.policy}, {adapter.tokens_per_frame} tokens/frame, budget {mem.budget_tokens} "
            f"tokens resident + {engine.stats().budget_offload_bytes} bytes offload, sample_fps {settings.sampler.sample_fps}"
        )

    # --- activate: work in, answers out --------------------------------------
    def activate_step(self) -> None:
        """Bring back a parked memory, start the worker, create subscriptions, services, action and timers.

        A parked memory that cannot be restored raises SnapshotError (or ConfigError for a
        budget set while inactive that does not hold) and stays parked.
        """
        if self._parked is not None:
            self._unpark()
        s, pose = self.settings.node, self.settings.pose
        route = FrameRoute(self, pose.worker_looks_up)  # ros/camera_intake.py: every sampled frame's way to the worker
        self.worker = ModelWorker(
            _held(self.engine, "the memory"), s.queue_size, s.max_pending_questions, on_ingest_error=self._ingest_error,
            max_batch=self.settings.vision.max_batch,  # parked frames' poses are resolved before the worker
            pose_lookup=route.pose_at_ingest if pose.worker_looks_up else None,
            vision_thread=self.settings.vision.own_thread)
        if pose.enabled:  # ros/pose_intake.py: each sampled frame gets the pose at its stamp; before the cameras
            self.poses = PoseIntake(self, pose, deliver=route.deliver, capacity=s.queue_size, drop=self.drop)
            self.keep(lambda p: p.destroy(), self.poses)
        self.keep(lambda c: c.destroy(), CameraIntake(self, s, route))  # ros/camera_intake.py
        service_group = ReentrantCallbackGroup()
        self.keep(lambda srv: srv.destroy(), MemoryServices(self, service_group))  # ~/reset, ~/save_memory, ~/load_memory
        self.keep(lambda srv: srv.destroy(), LocateService(self, service_group))  # ~/locate (ros/locate_service.py)
        self.keep(lambda srv: srv.destroy(), AskSurfaces(self, service_group))  # ~/ask service and action (ros/ask.py)
        # Spava long replay (ros/long_replay_client.py): None unless spava.enabled.
        if self.settings.spava.enabled:
            self.long_replay = LongReplayClient(self, self.settings.spava)
            self.keep(lambda c: c.close(), self.long_replay)
        mem = self.settings.memory
        if mem.snapshot_period_s > 0:
            self.snapshotter = snapshots.start_periodic(self, _held(self._series, "memory.snapshot_dir's series"), mem.snapshot_period_s,
                                                        MutuallyExclusiveCallbackGroup())
        self.view = start_view(self)  # ros/memory_view.py: None unless markers or sheet enabled; before the status
        self.status = StatusPublishers(self)  # last: a frame is taken once status is set
        self.keep(lambda p: p.destroy(), self.status)
        self.get_logger().info("active: ingesting frames and answering questions")

    def keep(self, destroy: Callable[[Any], Any], entity: Any) -> None:
        """Have ``destroy(entity)`` called when the node stops work (in the reverse order of creation)."""
        self._io.append((destroy, entity))

    # --- deactivate: stop work, free the memory's device memory ---------------
    def deactivate_step(self) -> None:
        """Stop all work, park the memory on host disk and free its device memory; log the figures before and after.

        The engine's own figures (KV resident on the device, the host arena's used and reserved
        bytes) drop to zero with it; on CUDA, torch's allocated and reserved bytes on the device
        are logged too.
        """
        self._stop_work()
        engine = _held(self.engine, "the memory")
        stats = engine.stats()
        device = str(_held(self.adapter, "the model").device)
        before = device_memory(device)
        self._parked, info = snapshots.park(engine)  # a private temporary directory; closes the engine
        self.engine = None
        free_device_memory()
        after = device_memory(device)
        self.get_logger().info(
            f"inactive: memory parked on host disk ({info.blocks} blocks, {info.bytes} bytes in {self._parked}); freed "
            f"KV resident on {device} {stats.bytes_resident} -> 0 bytes, host arena {stats.bytes_offloaded} -> 0 bytes used "
            f"(of {stats.budget_offload_bytes} -> 0 reserved)"
            + "".join(f", {k} {before[k]} -> {after[k]}" for k in sorted(before.keys() & after.keys()) if k != "device_memory")
        )

    def _stop_work(self, join_s: float | None = None) -> None:
        """Destroy what activate created (no new callback starts), then join the worker (its queue fails)."""
        io, self._io = self._io, []
        self.long_replay = self.poses = self.view = None
        for destroy, entity in reversed(io):
            destroy(entity)
        self.status = None
        if self.worker is not None:
            self.worker.stop(timeout=join_s)
            self.worker = None
        if self.snapshotter is not None:  # after the worker: a snapshot being written is finished, not cut
            self.snapshotter.close(wait=True)
            self.snapshotter = None

    def _unpark(self) -> None:
        """Rebuild the engine from the current settings and load the parked memory into it."""
        engine, info = snapshots.unpark(_held(self.adapter, "the model"), self.settings, _held(self._parked, "a parked memory"))
        self.engine, self._parked = engine, None
        self.get_logger().info(f"memory restored from parking: {info.blocks} blocks, {engine.stats().bytes_resident} bytes resident")
        if info.degraded:
            self.get_logger().error(f"parked memory restored without its damaged segments: {info.loss()}")

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
            # The worker has stopped: nothing else touches the engine.
            snapshots.save_on_shutdown(self.engine, self.settings.memory, self.get_logger())
            self.engine.close()
        if self._parked is not None:
            snapshots.discard(self._parked)
        self.engine = self.adapter = self.sampler = self.intake = self._parked = self._settings = self._series = None
        free_device_memory()
        self.get_logger().info("memory and model released")

    def shutdown_step(self) -> None:
        """From any state: stop work, write snapshot_on_shutdown if configured, release everything."""
        if self.adapter is not None:
            self.cleanup_step()

    def _ingest_error(self, exc: Exception) -> None:
        """The worker's report of a frame the model failed on: dropped and counted."""
        self.drop(f"the model failed on a frame: {exc!r}")

    # --- run-time parameters (params.RUNTIME) -------------------------------
    def parameters_callback(self, params) -> SetParametersResult:
        """Check the whole new configuration as at start, then apply it; a refusal gives the reason, nothing changed.

        Unconfigured (lifecycle node): every change is taken as it is; configure reads and
        checks the whole configuration. Inactive with the memory parked: checked here, the
        memory's new budget applies when activate rebuilds the engine.
        """
        if self._settings is None:
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
        _held(self.sampler, "the sampler").set_config(new.sampler)
        if self.status is not None:  # active: new thresholds from the next report, the new period from the next tick
            self.status.set_config(self.settings.node, new.node)
        self._settings = new
        self.get_logger().info("parameters set: " + ", ".join(f"{p.name}={p.value}" for p in params))
        return SetParametersResult(successful=True)

    def _on_worker(self, run: Callable[[], Any]) -> Any:
        """Run on the model thread, between two frames; still queued after question_timeout_s: WorkerBusy."""
        future = self.active_worker().call(run)
        try:
            return future.result(timeout=self.settings.node.question_timeout_s)
        except FutureTimeout:
            if future.cancel():
                raise WorkerBusy(f"the model stayed busy for question_timeout_s ({self.settings.node.question_timeout_s} s)") from None
            return future.result()  # already running: it is quick

    # --- what the node's parts share -------------------------------------------
    def active_worker(self) -> ModelWorker:
        """The running worker; WorkerStopped (a refusal with the reason) for a request that raced a deactivation."""
        worker = self.worker
        if worker is None:
            raise WorkerStopped("the node is not active")
        return worker

    def resolve_camera(self, name: str) -> str:
        """A camera named in a request, resolved like the node's own topics (an invalid name stays as it is)."""
        try:
            return self.resolve_topic_name(name)
        except Exception:  # an invalid topic name matches no camera; the engine says so
            return name

    def drop(self, message: str) -> None:
        """A frame dropped: counted, and a warning (throttled)."""
        self.counters.add("dropped")
        self.get_logger().warn(message, throttle_duration_sec=self.WARN_THROTTLE_S)


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


def _held(thing: T | None, what: str) -> T:
    """``thing``, which this state of the node holds; a step called out of order raises here, not on None later."""
    if thing is None:
        raise RuntimeError(f"{what} is not held: a lifecycle step called out of order")
    return thing
