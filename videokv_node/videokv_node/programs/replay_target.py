"""``--via ros``: the node as its own process, the bag's messages republished to it over DDS.

It lives with the ROS adapter, not in ``eval/`` (which never imports rclpy):
``programs/evaluate.py`` adds it to the evaluation CLI as ``--via ros``; it is a
``BagTarget`` (``eval/target.py``), like ``--via engine``. The recorded CDR bytes are
published unchanged (an unstamped frame gets its bag time as stamp, which is what
the node would give it under ``use_sim_time``), ``/clock`` follows the bag time, and
questions go through the node's ``~/ask`` service. The bag's odometry, tf and camera_info
(``ImageBag.relay``) are republished unchanged in their place in the stream, as ``ros2 bag
play`` would (``/tf_static`` transient local), so the node's ``pose_topic`` or tf lookups
give the answers' evidence poses; a topic whose message type this Python cannot import is
not relayed (``report`` lists it). Relayed messages go at most ``RELAY_RATE`` times real time:
the node's pose subscription is best effort (as odometry is), and a burst faster than the node
drains it loses poses (the robot bag at full speed: the frames of its first 12 s got none).

Ordering is exact at any speed: this side runs the node's own admission (decode,
then ``FrameSampler`` on header stamps, same settings), so it knows how many frames
the node will encode; before each question it waits on ``~/memory_stats`` until
``frames_ingested`` reaches that count, because the node's worker serves questions
before queued frames. Publishing also waits whenever half of the node's frame queue
is in use, so no frame is ever dropped for speed, and before a frame of another camera
until the node has encoded every earlier frame: DDS orders messages per topic only,
and the memory depends on the order frames are encoded in. The node's timers (the stats this
waits on) run on the wall clock: during that wait the bag's clock is held still, so
sim-time timers would never fire; the memory itself reads header stamps only.
"""

from __future__ import annotations

import time

from videokv_node.eval.bag_io import BagImage, BagMessage
from videokv_node.eval.questions import EvalQuestion
from videokv_node.eval.replay import Admission
from videokv_node.eval.results import ResultWriter
from videokv_node.eval.settings import EngineSettings
from videokv_node.eval.target import AskRefused, MemoryState, ReplayCounts, Reply
from videokv_node.ingest.sampler import NS_PER_S, FrameSampler

NODE_NAME = "videokv_eval"
# Node parameters of the replay itself (the memory settings come from the caller).
REPLAY_PARAMS = {
    "camera_qos": "reliable",  # a replay must not lose frames to best effort
    "camera_qos_depth": 1000,
    "queue_size": 16,
    "stats_period_s": 0.05,
    "max_pending_questions": 4,
    "question_timeout_s": 3600.0,
    "use_sim_time": False,
}
RELAY_RATE = 4.0  # x real time at most, between two relayed messages (bag time over wall time)


class RosTarget:
    """A ``BagTarget``: starts the node (``programs/launcher.py``), publishes frames, asks through ``programs/client.py``."""

    via = "ros"
    counts: ReplayCounts

    def __init__(self, settings: EngineSettings, params: dict, topics: list[str], compressed: set[str],
                 context=None, env: dict | None = None, settle_timeout_s: float = 600.0, log_path=None,
                 relay: dict[str, str] | None = None) -> None:
        import os

        import rclpy
        from rclpy.context import Context
        from rclpy.node import Node
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from rosgraph_msgs.msg import Clock
        from sensor_msgs.msg import CompressedImage, Image

        from videokv_node.programs.client import MemoryClient
        from videokv_node.programs.launcher import NodeProcess, isolated_ros_env

        self.counts = ReplayCounts()
        self.admission = Admission(FrameSampler(settings.sampler), self.counts)
        self.settle_timeout_s = settle_timeout_s
        self._last_camera: str | None = None  # camera of the last admitted frame
        self._own_context = context is None
        if context is None:
            env = env or isolated_ros_env()
            for key in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE", "RMW_IMPLEMENTATION"):
                os.environ[key] = env[key]  # this process joins the node's isolated domain
            context = Context()
            rclpy.init(context=context)
        self._context = context
        raw = [t for t in topics if t not in compressed]
        node_params = {**params, **REPLAY_PARAMS, "image_topics": raw or [""], "compressed_topics": sorted(compressed) or [""]}
        self.queue_size = node_params["queue_size"]
        self.proc = NodeProcess(node_params, env or dict(os.environ), log_path=log_path, node_name=NODE_NAME)
        self.client = MemoryClient(node_name=f"/{NODE_NAME}", context=context, client_name=f"{NODE_NAME}_player_client")
        self.player = Node(f"{NODE_NAME}_player", context=context)
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        self._pubs = {t: self.player.create_publisher(CompressedImage if t in compressed else Image, t, qos) for t in topics}
        self._clock = self.player.create_publisher(Clock, "/clock", 10)
        self._Clock = Clock
        self._relay, self.not_relayed = _relay_publishers(self.player, relay or {})
        self._last_relay: tuple[float, int] | None = None  # (monotonic s, bag time ns) of the last relayed message
        # Relayed topics the node reads (its pose source): wait until it subscribed, or the first poses are lost.
        pose_topic = "/" + str(node_params.get("pose_topic", "")).lstrip("/")
        tf = node_params.get("pose_source") == "tf"
        self._awaited = [pub for t, pub in self._relay.items() if t == pose_topic or (tf and t in ("/tf", "/tf_static"))]
        try:
            self._wait_up()
            # How the node scores options (answer.option_scoring): each reply names it (issue 43: the report called
            # every answer "letter" while the node scored by likelihood)
            self.option_scoring = str(self.client.parameter("answer.option_scoring") or "")
        except BaseException:
            self.close()
            raise

    def _wait_up(self, timeout: float = 180.0) -> None:
        if not self.client.wait_ready(timeout=timeout):
            raise RuntimeError("the node did not come up:\n" + self.proc.output()[-3000:])
        deadline = time.monotonic() + timeout
        for pub in [*self._pubs.values(), *self._awaited]:
            while pub.get_subscription_count() == 0:
                if time.monotonic() > deadline or not self.proc.alive():
                    raise RuntimeError(f"the node never subscribed to {pub.topic_name}:\n" + self.proc.output()[-3000:])
                time.sleep(0.05)
        self.client.wait_stats(lambda s: True, timeout=timeout)
        time.sleep(0.5)  # discovery completes on each side separately: let the node's readers match too

    def _stats(self, predicate, what: str):
        try:
            return self.client.wait_stats(predicate, timeout=self.settle_timeout_s)
        except TimeoutError as exc:
            alive = "running" if self.proc.alive() else f"exited with {self.proc.proc.returncode}"
            raise RuntimeError(f"the node (process {alive}) never {what}: {exc}\n{self.proc.output()[-3000:]}") from exc

    def offer(self, image: BagImage) -> None:
        frame = self.admission.admit(image)
        if frame is not None:
            # DDS keeps each topic's order but not the order across topics: before a frame of another
            # camera, the node must have encoded every earlier one, or its memory would differ.
            # Otherwise keep its queue at most half full, so it never drops a frame for speed.
            switch = self._last_camera not in (None, frame.camera)
            need = self.counts.admitted - (1 if switch else self.queue_size // 2)
            self._stats(lambda s: s.frames_ingested >= need, f"ingested {need} frames")
            self._last_camera = frame.camera
        data = image.raw if image.stamp_ns else image.restamped(image.bag_time_ns)
        self._pubs[image.topic].publish(data)
        sec, nanosec = divmod(image.bag_time_ns, NS_PER_S)
        clock = self._Clock()
        clock.clock.sec, clock.clock.nanosec = sec, nanosec
        self._clock.publish(clock)

    def relay(self, message: BagMessage) -> None:
        """Republish a recorded odometry, tf or camera_info message unchanged (the CDR bytes as recorded)."""
        pub = self._relay.get(message.topic)
        if pub is None:
            return
        if self._last_relay is not None:  # paced from the previous one: never a burst to catch up after a wait
            wall, bag_ns = self._last_relay
            delay = wall + (message.bag_time_ns - bag_ns) / NS_PER_S / RELAY_RATE - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        pub.publish(message.raw)
        self._last_relay = (time.monotonic(), message.bag_time_ns)

    def settle(self) -> None:
        """Return once the node has encoded every frame it admitted so far."""
        n = self.counts.admitted
        self._last = self._stats(lambda s: s.frames_ingested >= n and s.queue_depth == 0, f"ingested {n} frames")

    def ask(self, q: EvalQuestion) -> Reply:
        resp = self.client.ask(q.question, options=list(q.choices), timeout=REPLAY_PARAMS["question_timeout_s"])
        if not resp.success:
            raise AskRefused(resp.message)
        stamps = [int(t.sec) * NS_PER_S + int(t.nanosec) for t in resp.evidence_stamps]
        poses = [_xy_yaw(p) for p in resp.evidence_poses]
        return Reply(resp.answer, int(resp.option_index), stamps, float(resp.ttft_s), float(resp.total_s),
                     self.option_scoring if q.choices else "", evidence_poses=poses)

    def memory(self) -> MemoryState:
        s = self._last
        # The node reports no encode total; frames x its median per-frame ingest time estimates it.
        return MemoryState(s.frames_in_memory, s.tokens_resident, s.bytes_resident, s.bytes_offloaded,
                           s.frames_ingested * float(s.ingest_ms_p50))

    def report(self, writer: ResultWriter, origin_ns: int) -> dict:
        self.settle()
        for s in self.client.history:
            newest = int(s.newest_stamp.sec) * NS_PER_S + int(s.newest_stamp.nanosec)
            if s.frames_ingested:
                writer.add_memory_sample((newest - origin_ns) / NS_PER_S, s.bytes_resident, s.bytes_offloaded)
        last = self._last
        return {
            "ingest_ms_per_frame": {"p50": float(last.ingest_ms_p50), "p95": float(last.ingest_ms_p95), "n": int(last.frames_ingested)},
            "ingest_ms_source": "the node's ~/memory_stats (its window of the last 256 frames); "
                                "encode_ms_total is frames_ingested x that p50",
            "node_frames_dropped": int(last.frames_dropped),
            "not_relayed": self.not_relayed,
        }

    def close(self) -> None:
        import rclpy

        try:
            self.player.destroy_node()
            self.client.close()
        finally:
            code = self.proc.stop()
            if self._own_context:
                rclpy.try_shutdown(context=self._context)
        if code not in (0, None):
            raise RuntimeError(f"the node exited with {code}:\n{self.proc.output()[-3000:]}")


def _relay_publishers(node, relay: dict[str, str]) -> tuple[dict, dict[str, str]]:
    """Publishers for the relayed topics (topic -> "pkg/msg/Type"); and {topic: why not} for those not relayed."""
    import importlib

    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

    pubs, skipped = {}, {}
    for topic, msgtype in relay.items():
        pkg, _, name = msgtype.split("/")
        try:
            cls = getattr(importlib.import_module(f"{pkg}.msg"), name)
        except (ImportError, AttributeError) as exc:
            skipped[topic] = f"{msgtype} not importable here: {exc}"
            continue
        latched = topic == "/tf_static"  # as tf2's static broadcaster and ros2 bag play publish it
        qos = QoSProfile(depth=1 if latched else 1000, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL if latched else DurabilityPolicy.VOLATILE)
        pubs[topic] = node.create_publisher(cls, topic, qos)
    return pubs, skipped


def _xy_yaw(pose_stamped) -> tuple[float, float, float] | None:
    """(x, y, yaw) of an evidence pose; None where the node had none (an empty frame_id)."""
    import math

    if not pose_stamped.header.frame_id:
        return None
    p, q = pose_stamped.pose.position, pose_stamped.pose.orientation
    return float(p.x), float(p.y), math.atan2(2 * (q.w * q.z + q.x * q.y), 1 - 2 * (q.y * q.y + q.z * q.z))
