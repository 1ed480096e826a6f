"""Messages <-> library types. The node's only knowledge of message layouts lives here."""

from __future__ import annotations

from builtin_interfaces.msg import Time
from geometry_msgs.msg import PoseStamped

from videokv_node.ingest.image_decode import (
    check_compressed_image,
    check_raw_image,
    decode_compressed_image,
    decode_raw_image,
)
from videokv_node.ingest.sampler import NS_PER_S
from videokv_node.memory.question import Answer, Question
from videokv_node.memory.stats import EngineStats
from videokv_node.pose import Pose

def time_to_ns(stamp: Time) -> int:
    return int(stamp.sec) * NS_PER_S + int(stamp.nanosec)


def ns_to_time(ns: int) -> Time:
    return Time(sec=int(ns // NS_PER_S), nanosec=int(ns % NS_PER_S))


def check_image(msg) -> None:
    """sensor_msgs/Image checked without decoding (sizes, encoding, step vs data length); raises ImageDecodeError."""
    check_raw_image(msg.encoding, msg.width, msg.height, msg.step, len(msg.data))


def check_compressed(msg) -> None:
    """sensor_msgs/CompressedImage checked without decoding (format, non-empty data, signature); raises ImageDecodeError."""
    check_compressed_image(msg.format, msg.data)


def image_to_rgb(msg):
    """sensor_msgs/Image -> (H, W, 3) uint8 RGB; raises ImageDecodeError with a reason."""
    return decode_raw_image(msg.encoding, msg.width, msg.height, msg.step, msg.data, bool(msg.is_bigendian))


def compressed_to_rgb(msg):
    """sensor_msgs/CompressedImage -> (H, W, 3) uint8 RGB; raises ImageDecodeError with a reason."""
    return decode_compressed_image(msg.format, msg.data)


def request_scope(request, resolve_camera) -> dict:
    """The cameras and time window of an AskVideo or Locate request (same field names), as the
    ``cameras``/``since_ns``/``until_ns`` keywords of Question and LocateQuery; camera names are
    resolved like the node's own topics, empty ones dropped."""
    return {
        "cameras": [resolve_camera(c) for c in request.cameras if c],
        "since_ns": time_to_ns(request.since),
        "until_ns": time_to_ns(request.until),
    }


def request_to_question(request, resolve_camera) -> Question:
    """AskVideo request or action goal (same fields) -> Question."""
    return Question(
        text=request.question,
        options=list(request.options),
        max_new_tokens=int(request.max_new_tokens),
        **request_scope(request, resolve_camera),
    )


def fill_response(response, answer: Answer):
    """Answer -> AskVideo response or action result (the two have the same fields)."""
    response.success = True
    response.message = ""
    response.answer = answer.text
    response.option_index = answer.option_index
    response.option_scores = [float(s) for s in answer.option_scores]
    response.evidence_stamps = [ns_to_time(e.stamp_ns) for e in answer.evidence]
    response.evidence_cameras = [e.camera for e in answer.evidence]
    response.evidence_poses = [pose_to_msg(e.pose, e.stamp_ns) for e in answer.evidence]
    response.evidence_last_stamps = [ns_to_time(e.last) for e in answer.evidence]
    response.evidence_last_poses = [pose_to_msg(e.last_pose if e.last_stamp_ns else e.pose, e.last) for e in answer.evidence]
    response.ttft_s = float(answer.ttft_s)
    response.total_s = float(answer.total_s)
    return response


def pose_to_msg(pose: Pose | None, stamp_ns: int) -> PoseStamped:
    """A frame's pose as geometry_msgs/PoseStamped stamped with the frame's stamp; no pose: an empty
    ``header.frame_id`` (and the identity orientation), which is how the answers say "unknown"."""
    msg = PoseStamped()
    msg.header.stamp = ns_to_time(stamp_ns)
    msg.pose.orientation.w = 1.0
    if pose is None:
        return msg
    msg.header.frame_id = pose.frame_id
    p, q = msg.pose.position, msg.pose.orientation
    p.x, p.y, p.z = pose.position
    q.x, q.y, q.z, q.w = pose.orientation
    return msg


def msg_to_pose(msg: PoseStamped) -> Pose | None:
    """The inverse of ``pose_to_msg``: None for an empty frame_id or a pose that is not finite."""
    if not msg.header.frame_id:
        return None
    p, q = msg.pose.position, msg.pose.orientation
    try:
        return Pose.make(msg.header.frame_id, (p.x, p.y, p.z), (q.x, q.y, q.z, q.w))
    except ValueError:
        return None


def pose_fields(msg) -> tuple[int, str, tuple[float, float, float], tuple[float, float, float, float]]:
    """nav_msgs/Odometry, geometry_msgs/PoseStamped or PoseWithCovarianceStamped ->
    (stamp ns, frame_id, position, orientation (x, y, z, w)); the three share header + a pose."""
    pose = msg.pose.pose if hasattr(msg.pose, "pose") else msg.pose  # Odometry, PoseWithCovariance: .pose.pose
    p, q = pose.position, pose.orientation
    return time_to_ns(msg.header.stamp), msg.header.frame_id, (p.x, p.y, p.z), (q.x, q.y, q.z, q.w)


def fill_stats(msg, stats: EngineStats, counters: dict[str, int], queue_depth: int, model: str, device: str,
               vision_backend: str = ""):
    """MemoryStats from the engine's snapshot and the node's counters; ``vision_backend`` as
    ``VisionBackend.name`` (``tensorrt:fp16``, ``onnxruntime:CUDA``, ``torch:cpu``...)."""
    msg.policy = stats.policy
    msg.model = model
    msg.device = device
    msg.vision_backend = vision_backend
    msg.frames_received = counters["received"]
    msg.frames_sampled = counters["sampled"]
    msg.frames_ingested = stats.frames_ingested
    msg.frames_merged = stats.frames_merged
    msg.frames_dropped = counters["dropped"]
    msg.frames_evicted = stats.frames_evicted
    msg.frames_in_memory = stats.frames_in_memory
    msg.queue_depth = queue_depth
    msg.tokens_resident = stats.tokens_resident
    msg.tokens_offloaded = stats.tokens_offloaded
    msg.bytes_resident = stats.bytes_resident
    msg.bytes_offloaded = stats.bytes_offloaded
    msg.budget_tokens = stats.budget_tokens
    msg.budget_offload_bytes = stats.budget_offload_bytes
    msg.ingest_ms_p50 = stats.ingest_ms_p50
    msg.ingest_ms_p95 = stats.ingest_ms_p95
    msg.questions_answered = counters["answered"]
    msg.questions_failed = counters["failed"]
    msg.oldest_stamp = ns_to_time(stats.oldest_stamp_ns)
    msg.newest_stamp = ns_to_time(stats.newest_stamp_ns)
    msg.streamkv_open_segment_bytes = stats.streamkv_open_segment_bytes
    return msg
