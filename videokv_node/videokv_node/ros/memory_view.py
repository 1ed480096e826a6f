"""What the robot remembers, on the map and at a glance: ``~/memory_markers``, ``~/answer_markers``,
``~/memory_sheet`` and the ``~/publish_memory_sheet`` service (issue 46).

A thin adapter: the content is the library's (``view/markers.py``, ``view/contact_sheet.py``), drawn from a
``MemoryView`` that one timer reads from the engine on the model worker (a read-only job between two
frames, ``view/memory_view.py``'s ``read_view``: a few numbers per block, no tensor), at most
``markers.rate_hz``; everything else (drawing, encoding, publishing) runs on the timer's thread, off the
model worker and off the camera callbacks, which only keep a strided thumbnail of each sampled frame.
Markers are published only when the memory changed, the sheet on change at most once a second (node
clock) and on request. All three topics are reliable and transient local (depth 1): a viewer that
starts late gets the last drawing. Markers carry a zero stamp: RViz and Foxglove then place them with
the latest transform of their frame (the frame the poses are kept in), which the memory's poses are
expressed in for good; a stamp would make a viewer look up tf at a time its buffer may no longer hold.
"""

from __future__ import annotations

from concurrent.futures import TimeoutError as FutureTimeout

from geometry_msgs.msg import Point
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import CompressedImage
from std_srvs.srv import Trigger
from visualization_msgs.msg import Marker, MarkerArray

from videokv_node.ros.node_host import NodeHost
from videokv_node.runtime.worker import WorkerBusy, WorkerStopped
from videokv_node.view.contact_sheet import Thumbnails, render_sheet
from videokv_node.view.markers import EvidenceMark, MarkerBook, MarkerSpec, evidence_markers, memory_markers
from videokv_node.view.memory_view import MemoryView, read_view

LATCHED = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
SHEET_MIN_PERIOD_NS = 1_000_000_000  # the sheet at most once a second (node clock), but on request
VIEW_WAIT_S = 5.0  # a view not read within this (the worker is answering a long question) is skipped this tick
KINDS = {"sphere": Marker.SPHERE, "line_strip": Marker.LINE_STRIP, "text": Marker.TEXT_VIEW_FACING}


def to_marker(spec: MarkerSpec) -> Marker:
    """A ``MarkerSpec`` as a ``visualization_msgs/Marker`` (stamp zero: the latest transform; lifetime forever)."""
    m = Marker()
    m.header.frame_id = spec.frame_id
    m.ns, m.id = spec.ns, spec.id
    if spec.kind in ("delete", "delete_all"):
        m.action = Marker.DELETE if spec.kind == "delete" else Marker.DELETEALL
        return m
    m.type, m.action = KINDS[spec.kind], Marker.ADD
    m.pose.position.x, m.pose.position.y, m.pose.position.z = spec.position
    m.pose.orientation.w = 1.0
    m.scale.x, m.scale.y, m.scale.z = spec.scale
    m.color.r, m.color.g, m.color.b, m.color.a = spec.rgba
    m.text = spec.text
    m.points = [Point(x=x, y=y, z=z) for x, y, z in spec.points]
    return m


def to_array(specs: list[MarkerSpec]) -> MarkerArray:
    return MarkerArray(markers=[to_marker(s) for s in specs])


def start_view(node: NodeHost) -> "MemoryViewPublishers | None":
    """The view's publishers for an active node, destroyed with its other entities; None where
    ``markers.enabled`` and ``sheet.enabled`` are both false."""
    settings = node.settings
    if not (settings.markers.enabled or settings.sheet.enabled):
        return None
    view = MemoryViewPublishers(node)
    node.keep(lambda v: v.destroy(), view)
    return view


class MemoryViewPublishers:
    """The memory's markers and contact sheet of an active node (created only where ``markers.enabled`` or
    ``sheet.enabled``); ``node`` is the videokv node, read at each tick (a deactivation clears its worker)."""

    def __init__(self, node: NodeHost) -> None:
        self._node = node
        m, s = node.settings.markers, node.settings.sheet
        self._markers = node.create_publisher(MarkerArray, "~/memory_markers", LATCHED) if m.enabled else None
        self._answers = node.create_publisher(MarkerArray, "~/answer_markers", LATCHED) if m.enabled else None
        self._sheet = node.create_publisher(CompressedImage, "~/memory_sheet", LATCHED) if s.enabled else None
        self.thumbnails = Thumbnails(s.thumbnail_bytes, s.thumbnail_width) if s.enabled else None
        self._book = MarkerBook()
        self._drawn: MemoryView | None = None  # the view the markers show now
        self._sheet_view: MemoryView | None = None  # the view the published sheet shows
        self._sheet_ns: int | None = None  # node clock when the sheet was last published
        group = MutuallyExclusiveCallbackGroup()  # one tick at a time; the service waits behind a tick
        self._timer = node.create_timer(1.0 / m.rate_hz if m.enabled else 1.0, self.view_callback, callback_group=group)
        self._srv = (node.create_service(Trigger, "~/publish_memory_sheet", self.publish_sheet_callback, callback_group=group)
                     if s.enabled else None)

    def destroy(self) -> None:
        """Remove the timer, service and publishers (the node is deactivated)."""
        node = self._node
        node.destroy_timer(self._timer)
        if self._srv is not None:
            node.destroy_service(self._srv)
        for pub in (self._sheet, self._answers, self._markers):
            if pub is not None:
                node.destroy_publisher(pub)

    # --- from the node's other surfaces -------------------------------------
    def frame_sampled(self, camera: str, stamp_ns: int, rgb) -> None:
        """A frame was sampled for the memory: keep its thumbnail (a strided pick, no encoding)."""
        if self.thumbnails is not None:
            self.thumbnails.add(camera, stamp_ns, rgb)

    def answer_markers(self, words: str, moments: list[EvidenceMark]) -> None:
        """An answer's evidence on the map (``~/answer_markers``): the previous answer's markers go."""
        if self._answers is not None:
            self._answers.publish(to_array(evidence_markers(words, moments, self._node.settings.markers)))

    # --- the timer and the service -------------------------------------------
    def view_callback(self) -> None:
        """Read the memory (on the worker, read-only); redraw the markers if it changed, the sheet if it changed
        and a second passed since the last one."""
        view = self._read()
        if view is None:
            return
        if self._markers is not None and view != self._drawn:
            self._markers.publish(to_array(self._book.update(memory_markers(view, self._node.settings.markers))))
            self._drawn = view
        now = self._node.get_clock().now().nanoseconds
        if self._sheet is not None and view != self._sheet_view and (
                self._sheet_ns is None or now - self._sheet_ns >= SHEET_MIN_PERIOD_NS or now < self._sheet_ns):
            self._publish_sheet(view, now)

    def publish_sheet_callback(self, request, response):
        """Publish the contact sheet now, whatever the last one was; success=false with the reason if none."""
        view = self._read()
        if view is None:
            response.success, response.message = False, "the memory could not be read now (node inactive or busy)"
            return response
        size = self._publish_sheet(view, self._node.get_clock().now().nanoseconds)
        response.success = size is not None
        response.message = (f"published {size[0]} frames in {size[1]} bytes" if size is not None
                            else "no frame in memory has a thumbnail yet")
        return response

    def _read(self) -> MemoryView | None:
        node = self._node
        future = None
        try:
            worker = node.active_worker()
            future = worker.peek(lambda: read_view(worker.engine.store))  # never a planner's slot
            return future.result(timeout=VIEW_WAIT_S)
        except (WorkerBusy, WorkerStopped):
            return None
        except FutureTimeout:
            if future is not None:
                future.cancel()
            node.get_logger().warn("memory view: the model worker was busy; markers and sheet skip this tick",
                                   throttle_duration_sec=node.WARN_THROTTLE_S)
            return None

    def _publish_sheet(self, view: MemoryView, now_ns: int) -> tuple[int, int] | None:
        """Render and publish the sheet of ``view``: (frames shown, bytes), None where nothing can be shown."""
        thumbnails, publisher = self.thumbnails, self._sheet
        if thumbnails is None or publisher is None:  # the sheet is not enabled
            return None
        thumbnails.prune(view)
        sheet = render_sheet(view, thumbnails, self._node.settings.sheet)
        self._sheet_view, self._sheet_ns = view, now_ns
        if sheet is None:
            return None
        msg = CompressedImage(format="jpeg", data=sheet.jpeg)
        msg.header.stamp = self._node.get_clock().now().to_msg()
        publisher.publish(msg)
        return sheet.frames, len(sheet.jpeg)
