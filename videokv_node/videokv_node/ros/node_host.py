"""What a surface of the node may use of the node, and nothing more: ``NodeHost``.

The node's surfaces (``ask``, ``locate_service``, ``memory_services``, ``snapshots``, ``status``,
``diagnostics``, ``camera_intake``) are created on activate and destroyed on deactivate; each is
handed the node and reads its state at each request, because that state changes under it (run-time
parameters replace ``settings``; a deactivation clears ``worker``, ``poses``, ``long_replay``). They
type that node as ``NodeHost``, as the memory's policies see the engine as ``PolicyHost``
(``memory/policies/host.py``): this list is the whole of what they share with the node, and
``tests/unit/test_node_host.py`` fails on a surface that reads anything else of it.

``VideoKVMixin`` (``node.py``) on an rclpy ``Node`` or ``LifecycleNode`` is the one implementation:
a structural ``Protocol``, so the node needs no base class for it and a test may hand a surface a
small fake. The parts that only need ROS (``pose_intake``, ``tf_poses``, ``pose_parking``,
``params``, ``long_replay_client``) take an rclpy ``Node`` and read none of the node's state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

import numpy as np

from rclpy.callback_groups import CallbackGroup
from rclpy.clock import Clock
from rclpy.publisher import Publisher
from rclpy.qos import QoSProfile
from rclpy.service import Service
from rclpy.subscription import Subscription
from rclpy.timer import Timer

from videokv_node.ingest.frame_intake import FrameIntake
from videokv_node.ingest.sampler import FrameSampler
from videokv_node.memory.engine import VideoMemoryEngine
from videokv_node.ros.long_replay_client import LongReplayClient
from videokv_node.ros.params import Settings
from videokv_node.ros.pose_intake import PoseIntake
from videokv_node.runtime.counters import Counters
from videokv_node.runtime.periodic_snapshots import PeriodicSnapshotter
from videokv_node.runtime.worker import ModelWorker
from videokv_node.view.markers import EvidenceMark

# ``VideoKVMixin``'s base as the type checker sees it: it is only ever mixed into an rclpy ``Node`` or
# ``LifecycleNode``, so ``self`` has the Node's methods there and the node is checked against ``NodeHost``.
if TYPE_CHECKING:
    from rclpy.node import Node as NodeBase
else:
    NodeBase = object


class RosNode(Protocol):
    """The part of rclpy's ``Node`` the surfaces use: entities created and destroyed, the clock, the logger,
    names resolved; with rclpy's types and the keyword arguments the surfaces pass (mypy checks the node against it)."""

    def get_logger(self) -> Any: ...  # rclpy's Node.get_logger is unannotated
    def get_clock(self) -> Clock: ...
    def get_fully_qualified_name(self) -> str: ...
    def resolve_topic_name(self, topic: str, *, only_expand: bool = False) -> str: ...
    def create_service(self, srv_type: Any, srv_name: str, callback: Callable[[Any, Any], Any], *,
                       callback_group: CallbackGroup | None = None) -> Service: ...
    def destroy_service(self, service: Service) -> bool: ...
    def create_subscription(self, msg_type: Any, topic: str, callback: Callable[[Any], None], qos_profile: QoSProfile | int,
                            *, callback_group: CallbackGroup | None = None) -> Subscription: ...
    def destroy_subscription(self, subscription: Subscription) -> bool: ...
    def create_publisher(self, msg_type: Any, topic: str, qos_profile: QoSProfile | int) -> Publisher: ...
    def destroy_publisher(self, publisher: Publisher) -> bool: ...
    def create_timer(self, timer_period_sec: float, callback: Callable[[], Any],
                     callback_group: CallbackGroup | None = None) -> Timer: ...
    def destroy_timer(self, timer: Timer) -> bool: ...


class ViewSink(Protocol):
    """What the other surfaces hand the memory's view (``ros/memory_view.py``): sampled frames and answers."""

    def frame_sampled(self, camera: str, stamp_ns: int, rgb: np.ndarray) -> None: ...
    def answer_markers(self, words: str, moments: list[EvidenceMark]) -> None: ...


class StatusSink(Protocol):
    """What the other surfaces use of the status publishers (``ros/status.py``): a frame's arrival, per camera."""

    def frame_received(self, camera: str) -> None: ...


class NodeHost(RosNode, Protocol):
    """The node as its surfaces see it: its state (None where not held, see ``VideoKVMixin``) and four steps.

    Read an optional attribute once into a local: a deactivation may clear it between two reads.
    """

    WARN_THROTTLE_S: float  # the least time between two repeats of a warning on a hot path
    engine: VideoMemoryEngine | None  # the memory; only the model worker thread runs it
    worker: ModelWorker | None  # the model worker while active
    sampler: FrameSampler | None  # which frames are kept, by header stamp
    intake: FrameIntake | None  # check -> sample -> decode, per-camera counts
    counters: Counters  # frames and questions, thread-safe
    poses: PoseIntake | None  # robot poses while active, if pose_topic or pose_source tf
    long_replay: LongReplayClient | None  # the Spava forwarding while active, if spava.enabled
    snapshotter: PeriodicSnapshotter | None  # periodic snapshots while active, if memory.snapshot_period_s > 0

    # Read-only to the surfaces (properties): the node holds these as wider or narrower types.
    @property
    def settings(self) -> Settings:
        """Replaced whole by a run-time parameter change; read it at each request (set while configured)."""
        ...

    @property
    def view(self) -> ViewSink | None:
        """The memory's markers and contact sheet while active, if markers or sheet enabled."""
        ...

    @property
    def status(self) -> StatusSink | None:
        """The status publishers, set last on activate: a frame is taken once it is set."""
        ...

    def active_worker(self) -> ModelWorker:
        """The running worker; WorkerStopped for a request that raced a deactivation."""
        ...

    def resolve_camera(self, name: str) -> str:
        """A camera named in a request, resolved like the node's own topics."""
        ...

    def drop(self, message: str) -> None:
        """A frame dropped: counted, and a warning (throttled)."""
        ...

    def keep(self, destroy: Callable[[Any], Any], entity: Any) -> None:
        """Have ``destroy(entity)`` called when the node stops work (in the reverse order of creation)."""
        ...
