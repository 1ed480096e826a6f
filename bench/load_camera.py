"""One simulated camera driver for ``bench/load.py``: a topic at a fixed rate, best effort, in its own process.

A driver stamps each frame with its clock when it is taken and publishes with the
SensorData QoS; so does this. A process per camera, because one Python process cannot
push four cameras of raw 640x480 at 15 Hz (rclpy copies each message into C) and still
be on time. Frames are the synthetic scene (textured, shapes moving), pre-rendered and
encoded once, so what it costs here is publishing, as for a driver. Writes how many it
published and how late it fell as JSON (``--out``).

    python -m bench.load_camera --topic /cam0 --kind raw --width 640 --height 480 --hz 15 --seconds 180 --out c.json
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from videokv_node.synthetic import SyntheticScene

# Pre-rendered and cycled. A prime number of them, so that frames sampled k frames apart (15 Hz and
# sample_fps 0.5: k = 30) are different pictures unless k is a multiple of 37: the node sees a moving
# camera. With 30 (until 2026-11-27) every sampled frame was the same picture, which the node now
# merges as a still view (memory.redundancy, issue 36): the bench measured the still path.
DISTINCT_FRAMES = 37


def camera_frames(width: int, height: int, hz: float, seed: int) -> list[np.ndarray]:
    """The RGB frames a camera cycles through, in order (tests/unit/test_bench_load_camera.py)."""
    scene = SyntheticScene(width, height, fps=hz, seed=seed)
    return [scene.frame(i % len(scene)) for i in range(DISTINCT_FRAMES)]


def main(argv=None) -> int:
    import rclpy  # here, so the frames above can be checked without ROS
    from rclpy.qos import qos_profile_sensor_data
    from sensor_msgs.msg import CompressedImage, Image

    from videokv_node.programs.synthetic_camera import compressed_msg, image_msg
    from videokv_node.ros.conversions import ns_to_time

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--topic", required=True)
    p.add_argument("--kind", choices=("raw", "jpeg"), required=True)
    p.add_argument("--width", type=int, required=True)
    p.add_argument("--height", type=int, required=True)
    p.add_argument("--hz", type=float, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    make = compressed_msg if args.kind == "jpeg" else image_msg
    msgs = [make(rgb, 0, frame_id=args.topic.strip("/")) for rgb in camera_frames(args.width, args.height, args.hz, args.seed)]
    rclpy.init()
    node = rclpy.create_node(f"load_camera_{args.topic.strip('/').replace('/', '_')}")
    pub = node.create_publisher(CompressedImage if args.kind == "jpeg" else Image, args.topic, qos_profile_sensor_data)
    deadline = time.monotonic() + 30.0
    while pub.get_subscription_count() == 0 and time.monotonic() < deadline:  # the node's reader, as a driver would not
        time.sleep(0.05)
    time.sleep(1.0)  # best effort: a reader matched on one side only drops what it is sent
    period, published, late_s = 1.0 / args.hz, 0, []
    start = time.monotonic()
    t0_ns = time.time_ns()
    try:
        while (due := start + published * period) < start + args.seconds:
            now = time.monotonic()
            if now < due:
                time.sleep(due - now)
            late_s.append(max(0.0, time.monotonic() - due))
            msg = msgs[published % DISTINCT_FRAMES]
            msg.header.stamp = ns_to_time(time.time_ns())  # the driver's clock when the frame is taken
            pub.publish(msg)
            published += 1
    finally:
        wall = time.monotonic() - start
        late_s.sort()
        with open(args.out, "w") as f:
            json.dump({"topic": args.topic, "kind": args.kind, "size": f"{args.width}x{args.height}", "hz": args.hz,
                       "published": published, "wall_s": wall, "first_stamp_ns": t0_ns,
                       "bytes": len(msgs[0].data), "late_p95_s": late_s[int(0.95 * (len(late_s) - 1))] if late_s else 0.0}, f)
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
