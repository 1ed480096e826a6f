"""``~/locate`` (videokv_interfaces/srv/Locate): when and where the cameras saw something.

The request is checked here (empty query, top_k 0 or above ``locate_max_k``) and by the
engine (time window, query length, frames to rank); a refusal is success=false with
the reason and changes nothing. The ranking runs on the model worker like a question
(``VideoMemoryEngine.locate``: one question prefill at most, then by default one short pass per
shortlisted frame to re-rank them; no decoding).
"""

from __future__ import annotations

from concurrent.futures import TimeoutError as FutureTimeout

from videokv_interfaces.srv import Locate

from videokv_node.memory.questions.locate import LocateQuery
from videokv_node.memory.question import RequestError
from videokv_node.ros.conversions import ns_to_time, pose_to_msg, request_scope
from videokv_node.ros.node_host import NodeHost
from videokv_node.view.markers import EvidenceMark
from videokv_node.runtime.worker import WorkerBusy, WorkerStopped


def request_to_query(request, resolve_camera, max_k: int) -> LocateQuery:
    """Locate request -> LocateQuery; raises RequestError with the reason for a request refused outright."""
    if not request.query.strip():
        raise RequestError("query is empty")
    if not 1 <= request.top_k <= max_k:
        raise RequestError(f"top_k must be in [1, {max_k}] (locate_max_k), got {request.top_k}")
    return LocateQuery(text=request.query, top_k=int(request.top_k), **request_scope(request, resolve_camera))


def fill_locate_response(response, result):
    response.success, response.message = True, ""
    response.stamps = [ns_to_time(m.stamp_ns) for m in result.moments]
    response.cameras = [m.camera for m in result.moments]
    response.poses = [pose_to_msg(m.pose, m.stamp_ns) for m in result.moments]
    response.last_stamps = [ns_to_time(m.last_stamp_ns or m.stamp_ns) for m in result.moments]
    response.scores = [float(m.score) for m in result.moments]
    response.method = result.method
    response.latency_s = float(result.latency_s)
    return response


class LocateService:
    """The node's ``~/locate`` service; ``node`` is the videokv node (its worker, engine and settings)."""

    def __init__(self, node: NodeHost, callback_group) -> None:
        self._node = node
        self._srv = node.create_service(Locate, "~/locate", self.locate_callback, callback_group=callback_group)

    def locate_callback(self, request, response):
        """Rank the memory's moments for the query; any refusal is success=false with the reason."""
        node = self._node
        settings = node.settings
        future = None
        try:
            query = request_to_query(request, node.resolve_camera, settings.locate.max_k)
            worker = node.active_worker()
            future = worker.call(lambda: worker.engine.locate(query), read_only=True)
            result = future.result(timeout=settings.node.question_timeout_s)
        except (RequestError, WorkerBusy, WorkerStopped) as exc:
            return _refuse(response, str(exc))
        except FutureTimeout:
            if future is not None:
                future.cancel()
            return _refuse(response, f"no ranking within question_timeout_s ({settings.node.question_timeout_s} s)")
        except Exception as exc:  # the node keeps running whatever the model raised
            node.get_logger().error(f"locate failed: {exc!r}")
            return _refuse(response, f"internal error: {exc}")
        view = node.view
        if view is not None:  # the answer on the map: the moments by rank, labelled with the query
            view.answer_markers(request.query.strip(), [EvidenceMark(i, m.stamp_ns, m.pose, m.score)
                                                        for i, m in enumerate(result.moments)])
        return fill_locate_response(response, result)

    def destroy(self) -> None:
        self._node.destroy_service(self._srv)


def _refuse(response, message: str):
    response.success, response.message = False, message
    return response
