"""Publish the synthetic scene (``videokv_node.synthetic``) as a camera: for the demo and tests.

    python -m videokv_node.programs.synthetic_camera --topic camera/front --frames 120 --fps 4 --rate 10
    python -m videokv_node.programs.synthetic_camera --topic camera/front --story   # videokv-tiny's demo story
    python -m videokv_node.programs.synthetic_camera --topic camera/front --odom odom  # with the robot's odometry

Header stamps are ``start_ns + i / fps`` (scene time), published ``rate`` times
faster than real time; the stamps, not the publishing times, are what the
memory samples by. With ``--odom`` the robot's odometry (nav_msgs/Odometry, frame ``odom``)
is published along with the camera at ``ODOM_HZ`` of scene time, on a known trajectory
(``demo_pose``: an arc at 0.5 m/s turning 0.1 rad/s), each pose sent half a second (scene
time) ahead of the frames it brackets, so the node can interpolate every frame's pose.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import rclpy
from rclpy.node import Node
from rclpy.qos import QoSProfile, ReliabilityPolicy
from nav_msgs.msg import Odometry
from sensor_msgs.msg import CompressedImage, Image

from videokv_node.ingest.image_decode import encode_compressed_image, encode_raw_image
from videokv_node.ros.shutdown import shutdown_context
from videokv_node.ros.conversions import ns_to_time
from videokv_node.synthetic import SyntheticScene, default_scenario


def image_msg(rgb, stamp_ns: int, frame_id: str = "camera") -> Image:
    fields = encode_raw_image(rgb, "rgb8")
    msg = Image()
    msg.header.stamp = ns_to_time(stamp_ns)
    msg.header.frame_id = frame_id
    msg.height, msg.width, msg.encoding = fields["height"], fields["width"], fields["encoding"]
    msg.step, msg.is_bigendian, msg.data = fields["step"], 0, fields["data"]
    return msg


ODOM_HZ = 20.0
# Odometry is sent this far (scene time) ahead of each frame: the node reads a frame's pose when
# its image arrives, and the pose messages bracketing it must be in by then (two topics, no
# ordering between them across DDS and the node's callback threads).
ODOM_AHEAD_NS = 500_000_000
SPEED_M_S, TURN_RAD_S = 0.5, 0.1


def demo_pose(t_s: float) -> tuple[float, float, float]:
    """(x, y, yaw) of the demo robot ``t_s`` seconds of scene time after the camera's first frame:
    an arc from the origin, heading +x, at SPEED_M_S turning TURN_RAD_S (exact, no integration)."""
    r, a = SPEED_M_S / TURN_RAD_S, TURN_RAD_S * t_s
    return r * math.sin(a), r * (1.0 - math.cos(a)), a


def odometry_msg(stamp_ns: int, t_s: float) -> Odometry:
    x, y, yaw = demo_pose(t_s)
    msg = Odometry()
    msg.header.stamp = ns_to_time(stamp_ns)
    msg.header.frame_id, msg.child_frame_id = "odom", "base_link"
    msg.pose.pose.position.x, msg.pose.pose.position.y = x, y
    msg.pose.pose.orientation.z, msg.pose.pose.orientation.w = math.sin(yaw / 2), math.cos(yaw / 2)
    msg.twist.twist.linear.x, msg.twist.twist.angular.z = SPEED_M_S, TURN_RAD_S
    return msg


def compressed_msg(rgb, stamp_ns: int, frame_id: str = "camera") -> CompressedImage:
    fmt, data = encode_compressed_image(rgb, "jpeg")
    msg = CompressedImage()
    msg.header.stamp = ns_to_time(stamp_ns)
    msg.header.frame_id = frame_id
    msg.format, msg.data = fmt, data
    return msg


def things_stream(sources: list[str], fps: float, start_ns: int) -> list[tuple[int, object]]:
    """Real things as a camera pans over them, one after another (``tinyvlm/things_heldout.py``'s items by
    source, ``thing_frames`` each), stamped 1/fps apart from ``start_ns``."""
    from videokv_node.tinyvlm.things_heldout import held_out_items, thing_frames

    frames = [rgb for item in held_out_items(sources) for rgb in thing_frames(item)]
    return [(start_ns + round(i * 1e9 / fps), rgb) for i, rgb in enumerate(frames)]


def publish_scene(node: Node, topic: str, frames: int, fps: float, rate: float, start_ns: int, compressed: bool = False,
                  story: bool = False, odom_topic: str = "", things: list[str] | None = None,
                  pose_origin_ns: int = 0) -> int:
    """Publish ``frames`` frames of the default scenario, with ``story`` every frame of videokv-tiny's
    demo story (``tinyvlm/story.py``), or with ``things`` a pan over each real thing (``things_stream``;
    ``frames`` is then ignored); returns how many were published.
    With ``odom_topic``, odometry at ODOM_HZ too, every pose up to ODOM_AHEAD_NS past a frame sent
    before it; the pose at stamp t is ``demo_pose`` of t - ``pose_origin_ns`` (default ``start_ns``), so a
    second publish continues the first one's trajectory."""
    msg_type = CompressedImage if compressed else Image
    # Reliable: a test or demo must not lose frames to the network, only to the node's own sampling.
    pub = node.create_publisher(msg_type, topic, QoSProfile(depth=50, reliability=ReliabilityPolicy.RELIABLE))
    odom = node.create_publisher(Odometry, odom_topic, QoSProfile(depth=200, reliability=ReliabilityPolicy.RELIABLE)) if odom_topic else None
    deadline = time.monotonic() + 10.0
    while pub.get_subscription_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    while odom is not None and odom.get_subscription_count() == 0 and time.monotonic() < deadline + 5.0:
        time.sleep(0.05)  # the node subscribes once it has seen the topic's type (pose_type auto)
    # The reader matches this writer a moment after this writer matched it; a best-effort
    # (sensor_data) reader would drop what arrives before that.
    time.sleep(1.0)
    if things:
        stream = things_stream(things, fps, start_ns)
    elif story:
        from videokv_node.tinyvlm.story import Story

        stream = list(Story(fps=fps).frames(start_ns))
    else:
        scene = SyntheticScene(fps=fps, scenario=default_scenario(frames))
        stream = [(stamp_ns, rgb) for stamp_ns, rgb, _ in scene.frames(frames, start_stamp_ns=start_ns)]
    period = 1.0 / (fps * rate) if rate > 0 else 0.0
    odom_period_ns, next_odom = round(1e9 / ODOM_HZ), 0
    for stamp_ns, rgb in stream:
        while odom is not None and start_ns + next_odom * odom_period_ns <= stamp_ns + ODOM_AHEAD_NS:
            stamp = start_ns + next_odom * odom_period_ns
            odom.publish(odometry_msg(stamp, (stamp - (pose_origin_ns or start_ns)) / 1e9))
            next_odom += 1
        pub.publish(compressed_msg(rgb, stamp_ns) if compressed else image_msg(rgb, stamp_ns))
        if period:
            time.sleep(period)
    return len(stream)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topic", default="image")
    parser.add_argument("--frames", type=int, default=120)
    parser.add_argument("--fps", type=float, default=4.0, help="scene frames per second (stamp spacing)")
    parser.add_argument("--rate", type=float, default=10.0, help="real-time factor; 0 = as fast as possible")
    parser.add_argument("--start-ns", type=int, default=0, help="stamp of frame 0; 0 = the node clock now")
    parser.add_argument("--compressed", action="store_true")
    parser.add_argument("--story", action="store_true", help="videokv-tiny's demo story instead of the default scenario")
    parser.add_argument("--things", default="", help="comma-separated real things (tinyvlm/things_heldout.py sources) panned over instead")
    parser.add_argument("--pose-origin-ns", type=int, default=0, help="stamp at which the odometry's trajectory starts; 0 = --start-ns")
    parser.add_argument("--odom", default="", help="also publish the robot's odometry (nav_msgs/Odometry) on this topic")
    args, ros_args = parser.parse_known_args(argv)
    rclpy.init(args=ros_args)
    node = Node("synthetic_camera")
    try:
        start = args.start_ns or node.get_clock().now().nanoseconds
        n = publish_scene(node, args.topic, args.frames, args.fps, args.rate, start, args.compressed, args.story, args.odom,
                          [t for t in args.things.split(",") if t], args.pose_origin_ns)
        time.sleep(0.5)  # let reliable delivery finish before the publisher goes
        node.get_logger().info(f"published {n} frames on {args.topic}")
    except KeyboardInterrupt:
        pass
    finally:
        node.destroy_node()
        shutdown_context()
    return 0


if __name__ == "__main__":
    sys.exit(main())
