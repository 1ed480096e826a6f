"""A bag replayed into the node over DDS while ``~/memory_markers`` and ``~/memory_sheet`` are recorded as a viewer
receives them: what ``programs/memory_picture.py`` draws (the README's picture) and what the integration test of the
markers against the example bag's truth checks (tests/integration/test_memory_view_bag_ros.py).

The node is started and fed by the evaluation's own replay target (``programs/replay_target.py``'s ``RosTarget``:
the recorded bytes republished, odometry and tf relayed in their place, no frame dropped for speed); this module only
listens, with a viewer's QoS (reliable, transient local), on the client's node, which spins on its own thread.
Marker messages are turned back into the library's ``MarkerSpec`` (``view/markers.py``), so what is checked and drawn
is plain data, and ``shown`` applies a sequence of them as RViz does (ADD sets, DELETE removes, DELETEALL clears).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from videokv_node.eval.bag_io import BagMessage, ImageBag
from videokv_node.eval.settings import engine_settings, typed_parameters
from videokv_node.programs.replay_target import NODE_NAME, RosTarget
from videokv_node.view.markers import MarkerSpec

KIND_OF = {2: "sphere", 4: "line_strip", 9: "text"}  # visualization_msgs/Marker types the node publishes
SETTLE_QUIET_S = 2.0  # the drawing is final once the memory is settled and no array came for this long


def from_marker(m) -> MarkerSpec:
    """A ``visualization_msgs/Marker`` as the ``MarkerSpec`` it was made from (``ros/memory_view.py``'s ``to_marker``)."""
    if m.action in (2, 3):  # DELETE, DELETEALL
        return MarkerSpec(m.ns, m.id, "delete" if m.action == 2 else "delete_all", m.header.frame_id)
    p, c = m.pose.position, m.color
    return MarkerSpec(m.ns, m.id, KIND_OF.get(m.type, f"type {m.type}"), m.header.frame_id, (p.x, p.y, p.z),
                      tuple((q.x, q.y, q.z) for q in m.points), (m.scale.x, m.scale.y, m.scale.z),
                      (c.r, c.g, c.b, c.a), m.text)


def shown(arrays: list[list[MarkerSpec]]) -> dict[tuple[str, int], MarkerSpec]:
    """What a viewer shows after ``arrays`` in order: an add sets its (ns, id), a delete removes it, delete_all clears."""
    out: dict[tuple[str, int], MarkerSpec] = {}
    for array in arrays:
        for m in array:
            if m.kind == "delete_all":
                out.clear()
            elif m.kind == "delete":
                out.pop(m.key, None)
            else:
                out[m.key] = m
    return out


@dataclass(slots=True)
class Capture:
    """What the viewer received, in order, and the node's last ``~/memory_stats``."""

    arrays: list[list[MarkerSpec]] = field(default_factory=list)  # each ~/memory_markers message
    sheets: list[bytes] = field(default_factory=list)  # each ~/memory_sheet's JPEG
    frames_ingested: int = 0
    frames_in_memory: int = 0
    node_log: str = ""

    @property
    def final(self) -> dict[tuple[str, int], MarkerSpec]:
        return shown(self.arrays)


def _wait_for(done, lock: threading.Lock, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with lock:
            if done():
                return True
        time.sleep(0.05)
    return False


def capture_replay(bag_path: str | Path, params: dict, *, context=None, env: dict | None = None,
                   log_path: str | Path | None = None, timeout_s: float = 300.0) -> Capture:
    """Replay ``bag_path`` (every image topic, odometry and tf relayed) into a node with ``params`` and record its
    markers and sheets until the drawing is final: every frame ingested, then no new array for ``SETTLE_QUIET_S``;
    then one sheet on request (``~/publish_memory_sheet``). ``context``/``env``: a test's DDS domain (else its own)."""
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import CompressedImage
    from std_srvs.srv import Trigger
    from visualization_msgs.msg import MarkerArray

    typed = typed_parameters(params)
    capture, lock = Capture(), threading.Lock()
    last = [time.monotonic()]

    def on_markers(msg) -> None:
        with lock:
            capture.arrays.append([from_marker(m) for m in msg.markers])
            last[0] = time.monotonic()

    def on_sheet(msg) -> None:
        with lock:
            capture.sheets.append(bytes(msg.data))

    latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    with ImageBag(bag_path) as bag:
        target = RosTarget(engine_settings(typed), typed, bag.topics, set(), context=context, env=env,
                           settle_timeout_s=timeout_s, log_path=log_path, relay=bag.relay)
        try:
            node = target.client.node  # spun by the client's own thread
            node.create_subscription(MarkerArray, f"/{NODE_NAME}/memory_markers", on_markers, latched)
            node.create_subscription(CompressedImage, f"/{NODE_NAME}/memory_sheet", on_sheet, latched)
            _wait_for(lambda: capture.arrays, lock, 30.0)  # matched: the empty memory's drawing (latched) came
            for message in bag.messages():
                if isinstance(message, BagMessage):
                    target.relay(message)
                else:
                    target.offer(message)
            target.settle()
            _wait_for(lambda: capture.arrays and time.monotonic() - last[0] >= SETTLE_QUIET_S, lock, timeout_s)
            trigger = node.create_client(Trigger, f"/{NODE_NAME}/publish_memory_sheet")
            with lock:
                before = len(capture.sheets)
            if trigger.wait_for_service(timeout_sec=30) and target.client._call(trigger, Trigger.Request(), 60).success:
                _wait_for(lambda: len(capture.sheets) > before, lock, 30.0)
            stats = target.client.stats
            capture.frames_ingested, capture.frames_in_memory = int(stats.frames_ingested), int(stats.frames_in_memory)
        finally:
            capture.node_log = target.proc.output()
            target.close()
    with lock:
        return Capture(list(capture.arrays), list(capture.sheets), capture.frames_ingested, capture.frames_in_memory,
                       capture.node_log)
