"""Poses from a live tf tree, as a robot has it (issue 33): how many frames get a pose, and how exact.

The node runs as a process (``pose_source: tf``); this process broadcasts a static map->odom and
odom->base_link at ``--tf-hz`` stamped with the clock *now* (a robot's odometry), and publishes a
camera at ``--camera-hz`` stamped now too, for ``--seconds``. Then it asks one question with the
``full`` policy (every frame is evidence) and compares each evidence pose with the trajectory at the
frame's stamp. Prints one JSON line: frames with and without a pose (by reason, from /diagnostics),
the position error's median and max against the truth.

    . ./env.sh && python -m bench.tf_poses --wait 0.5           # this tree's node
    python -m bench.tf_poses --source /tmp/tf-base --wait -1     # another source tree (e.g. before issue 33)

``--wait -1`` leaves ``pose_tf_wait_s`` out of the parameters (for a node that does not know it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import numpy as np


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wait", type=float, default=0.5, help="pose_tf_wait_s; -1: not set")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--camera-hz", type=float, default=10.0)
    parser.add_argument("--tf-hz", type=float, default=20.0)
    parser.add_argument("--sample-fps", type=float, default=2.0)
    parser.add_argument("--source", default="", help="run the node from this source tree's videokv_node/")
    args = parser.parse_args(argv)

    import rclpy
    import tf2_ros
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.context import Context
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import Image

    from videokv_node.programs.client import MemoryClient
    from videokv_node.ros.conversions import time_to_ns
    from videokv_node.programs.launcher import NodeProcess, isolated_ros_env
    from videokv_node.programs.synthetic_camera import image_msg

    env = isolated_ros_env()
    env["OMP_NUM_THREADS"] = "1"
    if args.source:
        env["PYTHONPATH"] = f"{os.path.join(args.source, 'videokv_node')}:{env.get('PYTHONPATH', '')}"
    os.environ.update({k: env[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE")})
    params = {"model": "tiny", "image_topics": ["cam"], "camera_qos": "reliable", "sample_fps": args.sample_fps,
              "memory.policy": "full", "memory.budget_tokens": 16384, "max_new_tokens": 2, "diagnostics_period_s": 0.5,
              "pose_source": "tf", "pose_frame": "map", "base_frame": "base_link"}
    if args.wait >= 0:
        params["pose_tf_wait_s"] = args.wait
    ctx = Context()
    rclpy.init(context=ctx)
    proc = NodeProcess(params, env, node_name="videokv_tfbench")
    client = MemoryClient(node_name="/videokv_tfbench", context=ctx, client_name="tfbench_client")
    peer = Node("tfbench_peer", context=ctx)
    status: dict[str, str] = {}
    peer.create_subscription(DiagnosticArray, "/diagnostics", lambda m: status.update(
        {kv.key: kv.value for s in m.status if s.name == "videokv: poses" for kv in s.values}), 10)
    executor = SingleThreadedExecutor(context=ctx)
    executor.add_node(peer)
    try:
        if not client.wait_ready(timeout=180):
            raise SystemExit("node did not come up:\n" + proc.output())
        static, dynamic = tf2_ros.StaticTransformBroadcaster(peer), tf2_ros.TransformBroadcaster(peer)
        cam = peer.create_publisher(Image, "/cam", QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE))
        while cam.get_subscription_count() == 0 or dynamic.pub_tf.get_subscription_count() == 0:
            time.sleep(0.1)
        time.sleep(1.0)
        clock = peer.get_clock()
        t0 = clock.now().nanoseconds
        static.sendTransform(_transform("map", "odom", t0, (1.0, 2.0, 0.0), _quat(math.pi / 2)))
        rgb = np.random.default_rng(0).integers(0, 256, (24, 32, 3), dtype=np.uint8)
        next_tf = next_cam = time.monotonic()
        end = next_tf + args.seconds
        while time.monotonic() < end:  # the pacing of publication only; every stamp is the ROS clock's now
            now = time.monotonic()
            if now >= next_tf:
                s = clock.now().nanoseconds
                dynamic.sendTransform(_transform("odom", "base_link", s, *_odom(s - t0)))
                next_tf += 1.0 / args.tf_hz
            if now >= next_cam:
                cam.publish(image_msg(rgb, clock.now().nanoseconds))
                next_cam += 1.0 / args.camera_hz
            executor.spin_once(timeout_sec=0.001)
        time.sleep(max(args.wait, 0.0) + 1.0)
        st = client.wait_stats(lambda m: m.queue_depth == 0 and m.frames_sampled > 0, timeout=120)
        resp = client.ask("What is there?")
        errors, without = [], 0
        for stamp, pose in zip(resp.evidence_stamps, resp.evidence_poses):
            if not pose.header.frame_id:
                without += 1
                continue
            want = _map_base(time_to_ns(stamp) - t0)
            p = pose.pose.position
            errors.append(math.dist((p.x, p.y, p.z), want))
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.1)
        reasons = {k.removeprefix("frames_without_pose_"): int(v) for k, v in status.items()
                   if k.startswith("frames_without_pose_") and v != "0"}
        print(json.dumps({
            "source": args.source or "this tree", "pose_tf_wait_s": args.wait, "seconds": args.seconds,
            "tf_hz": args.tf_hz, "camera_hz": args.camera_hz, "sample_fps": args.sample_fps,
            "frames_ingested": st.frames_ingested, "evidence": len(resp.evidence_stamps),
            "evidence_with_pose": len(errors), "evidence_without_pose": without,
            "without_pose_by_reason": reasons, "frames_waited_for_tf": status.get("frames_waited_for_tf"),
            "position_error_m_median": statistics.median(errors) if errors else None,
            "position_error_m_max": max(errors) if errors else None,
        }))
    finally:
        executor.remove_node(peer)
        peer.destroy_node()
        client.close()
        proc.stop()
        rclpy.try_shutdown(context=ctx)


V, W = 0.5, 0.2  # the robot's speed (m/s) and turn rate (rad/s) in odom


def _odom(t_ns: int):
    """odom -> base_link at t: straight at V along a heading turning at W (x, y from the closed form)."""
    t = t_ns / 1e9
    yaw = W * t
    return (V / W * math.sin(yaw), V / W * (1 - math.cos(yaw)), 0.0), _quat(yaw)


def _map_base(t_ns: int) -> tuple[float, float, float]:
    (x, y, z), _ = _odom(t_ns)
    return 1.0 - y, 2.0 + x, z  # map -> odom: (1, 2), rotated 90 degrees


def _quat(yaw: float):
    return 0.0, 0.0, math.sin(yaw / 2), math.cos(yaw / 2)


def _transform(parent: str, child: str, stamp_ns: int, xyz, q):
    from geometry_msgs.msg import TransformStamped

    from videokv_node.ros.conversions import ns_to_time

    t = TransformStamped()
    t.header.stamp, t.header.frame_id, t.child_frame_id = ns_to_time(stamp_ns), parent, child
    t.transform.translation.x, t.transform.translation.y, t.transform.translation.z = xyz
    r = t.transform.rotation
    r.x, r.y, r.z, r.w = q
    return t


if __name__ == "__main__":
    main()
