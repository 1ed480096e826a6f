"""Camera intake over real DDS: malformed frames counted per camera and reason, only sampled frames decoded.

A node process with two cameras at sample_fps 0.5; this process publishes good and bad
frames with chosen stamps (reliable, so every one arrives, in order per topic) and reads
the counts on ``~/memory_stats`` and on the cameras' ``/diagnostics`` statuses.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2 (rclpy) is not installed: run `make test`")

from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from sensor_msgs.msg import CompressedImage, Image  # noqa: E402

from videokv_node.ros.conversions import ns_to_time  # noqa: E402
from videokv_node.programs.synthetic_camera import compressed_msg, image_msg  # noqa: E402

from .test_node_ros import RELIABLE, bad_image, running_node, wait_subscribed  # noqa: E402

NS = 1_000_000_000


def _frame(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (24, 32, 3), dtype=np.uint8)


def _compressed(data: bytes, stamp_ns: int) -> CompressedImage:
    msg = CompressedImage()
    msg.header.stamp = ns_to_time(stamp_ns)
    msg.format, msg.data = "jpeg", data
    return msg


def test_malformed_frames_are_counted_per_camera_and_reason_and_the_node_keeps_answering(ros):
    params = {
        "model": "tiny",
        "image_topics": ["cam_raw"],
        "compressed_topics": ["cam_jpeg/compressed"],
        "camera_qos": "reliable",
        "camera_qos_depth": 50,
        "sample_fps": 0.5,
        "stats_period_s": 0.2,
        "diagnostics_period_s": 0.2,
        "max_new_tokens": 2,
    }
    good_jpeg = bytes(compressed_msg(_frame(1), 0).data)
    raw = [  # (message, what the node does with it)
        (image_msg(_frame(0), 10 * NS), "sampled"),
        (bad_image(data=b"\0" * 10, stamp_ns=10 * NS + NS // 2), "malformed: short data, not due either"),
        (image_msg(_frame(2), 11 * NS), "skipped: not due, never decoded"),
        (image_msg(_frame(3), 12 * NS), "sampled"),
        (bad_image(encoding="32FC1", stamp_ns=13 * NS), "malformed: never reaches the sampler"),
        (image_msg(_frame(4), 11 * NS + NS // 2), "stale: older than 12 s, the newest offered"),
    ]
    jpeg = [
        (_compressed(good_jpeg, 10 * NS), "sampled"),
        (_compressed(good_jpeg[: len(good_jpeg) // 3], 12 * NS), "sampled, then undecodable: gives its slot back"),
        (_compressed(good_jpeg, 12 * NS + NS // 2), "sampled: takes the slot at once"),
        (_compressed(good_jpeg, 13 * NS), "skipped"),
        (_compressed(b"GIF89a not a jpeg", 15 * NS), "malformed: no JPEG/PNG signature, even though due"),
    ]
    with running_node(ros, params, "videokv_intake") as (proc, client, cam):
        cameras: dict[str, dict[str, str]] = {}
        seen = threading.Condition()

        def on_diagnostics(msg):
            with seen:
                for s in msg.status:
                    if s.name.startswith("videokv: camera "):
                        values = {kv.key: kv.value for kv in s.values}
                        cameras[values["topic"]] = values
                seen.notify_all()

        client.node.create_subscription(DiagnosticArray, "/diagnostics", on_diagnostics, 10)
        pub_raw = cam.create_publisher(Image, "/cam_raw", RELIABLE)
        pub_jpeg = cam.create_publisher(CompressedImage, "/cam_jpeg/compressed", RELIABLE)
        wait_subscribed(pub_raw)
        wait_subscribed(pub_jpeg)
        for pub, frames in ((pub_raw, raw), (pub_jpeg, jpeg)):
            for msg, _ in frames:
                pub.publish(msg)
                time.sleep(0.05)
        stats = client.wait_stats(lambda s: s.frames_received == 11 and s.frames_ingested == 4 and s.queue_depth == 0,
                                  timeout=120)
        # The JPEG camera's two good frames are the same image: the second is merged into the first's span
        # (memory.redundancy, the robot default since issue 36), so 4 ingested make 3 blocks.
        assert (stats.frames_sampled, stats.frames_dropped, stats.frames_in_memory, stats.frames_merged) == (4, 5, 3, 1)
        expected = {
            "/cam_raw": {"frames_received": "6", "frames_sampled": "2", "frames_skipped": "1", "frames_ingested": "2",
                         "frames_dropped_malformed_short_data": "1",
                         "frames_dropped_malformed_unsupported_encoding": "1", "frames_dropped_stale": "1"},
            "/cam_jpeg/compressed": {"frames_received": "5", "frames_sampled": "2", "frames_skipped": "1",
                                     "frames_ingested": "2", "frames_dropped_undecodable_corrupt_compressed": "1",
                                     "frames_dropped_malformed_corrupt_compressed": "1"},
        }

        def counts():
            return {c: {k: v for k, v in values.items() if k.startswith("frames_")} for c, values in cameras.items()}

        with seen:
            assert seen.wait_for(lambda: counts() == expected, timeout=30), counts()
        resp = client.ask("What do you see?")
        assert resp.success, resp.message
        assert proc.alive()
