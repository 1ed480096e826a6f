"""Start the videokv node with config/memory.yaml.

    ros2 launch videokv_node memory.launch.py
    ros2 launch videokv_node memory.launch.py model:=/models/llava-onevision-qwen2-0.5b-ov-hf \
        image_topic:=/camera/color/image_raw policy:=rekv use_sim_time:=true
    ros2 launch videokv_node memory.launch.py policy:=streamkv question_stage:=tgvkv
    ros2 launch videokv_node memory.launch.py lifecycle:=true   # then: ros2 lifecycle set /videokv configure
    ros2 launch videokv_node memory.launch.py pose_topic:=/odom  # store the robot's pose with every frame
    ros2 launch videokv_node memory.launch.py memory_dir:=/var/lib/videokv  # crash-safe: snapshots, restored at start

The camera QoS comes from the params file (sensor_data by default, as in the
node), so the launch default and the node default always agree. With
lifecycle:=true the node starts unconfigured (a LifecycleNode action, so launch
can emit and react to its transitions); a lifecycle manager or
`ros2 lifecycle set` drives it. With memory_dir:=DIR the memory survives a crash: a
periodic snapshot into DIR every snapshot_period_s (node clock) and, at start, the newest
good one restored (memory.snapshot_dir, memory.snapshot_period_s and memory.restore_on_start:
latest; docs/OPERATIONS.md, "Running all day"). Left empty (the default) it sets none of
them, so a params file's snapshot settings stand. Every argument is documented in the README.
"""

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.conditions import IfCondition, UnlessCondition
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode, Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare


def generate_launch_description() -> LaunchDescription:
    default_params = PathJoinSubstitution([FindPackageShare("videokv_node"), "config", "memory.yaml"])
    args = [
        DeclareLaunchArgument("namespace", default_value="", description="namespace of the node"),
        DeclareLaunchArgument("params_file", default_value=default_params, description="parameter file"),
        DeclareLaunchArgument("model", default_value="videokv-tiny",
                              description="'videokv-tiny' (self-trained, sees for real; the default), 'tiny' or 'tiny-qwen2.5-vl' "
                                          "(random weights, for tests), or a local checkpoint directory"),
        DeclareLaunchArgument("policy", default_value="rekv", description="memory policy: full, rekv, streamkv, hermes or mukv"),
        DeclareLaunchArgument("question_stage", default_value="none", description="question-time stage: none or tgvkv (TGV-KV)"),
        DeclareLaunchArgument("image_topic", default_value="image", description="camera topic the 'image' input is remapped to"),
        DeclareLaunchArgument("pose_topic", default_value="",
                              description="robot pose topic (nav_msgs/Odometry, geometry_msgs/PoseStamped or "
                                          "PoseWithCovarianceStamped) stored with every frame; empty: no poses"),
        DeclareLaunchArgument("use_sim_time", default_value="false", description="follow /clock (bag replay, simulation)"),
        DeclareLaunchArgument("lifecycle", default_value="false",
                              description="true: a managed (lifecycle) node, unconfigured until configure; false: the plain node"),
        DeclareLaunchArgument("memory_dir", default_value="",
                              description="crash-safe memory: periodic snapshots into this directory, the newest good one "
                                          "restored at start; empty: the params file's snapshot settings (off by default)"),
        DeclareLaunchArgument("snapshot_period_s", default_value="60.0",
                              description="with memory_dir: seconds (node clock) between periodic snapshots"),
    ]
    return LaunchDescription(args + [OpaqueFunction(function=_nodes)])


def _nodes(context):
    """The node, plain or lifecycle; the snapshot parameters only when memory_dir is given."""
    lifecycle = LaunchConfiguration("lifecycle")
    overrides = {
        "model": ParameterValue(LaunchConfiguration("model"), value_type=str),
        "memory.policy": ParameterValue(LaunchConfiguration("policy"), value_type=str),
        "memory.question_stage": ParameterValue(LaunchConfiguration("question_stage"), value_type=str),
        "pose_topic": ParameterValue(LaunchConfiguration("pose_topic"), value_type=str),
        "use_sim_time": ParameterValue(LaunchConfiguration("use_sim_time"), value_type=bool),
        "lifecycle": ParameterValue(lifecycle, value_type=bool),
    }
    memory_dir = LaunchConfiguration("memory_dir").perform(context).strip()
    if memory_dir:
        overrides.update({
            "memory.snapshot_dir": memory_dir,
            "memory.snapshot_period_s": ParameterValue(LaunchConfiguration("snapshot_period_s"), value_type=float),
            "memory.restore_on_start": "latest",
        })
    # One description of the node; only the action type and its condition differ.
    node = dict(
        package="videokv_node",
        executable="videokv_node",
        name="videokv",
        namespace=LaunchConfiguration("namespace"),
        output="screen",
        emulate_tty=True,
        parameters=[LaunchConfiguration("params_file"), overrides],
        remappings=[("image", LaunchConfiguration("image_topic"))],
    )
    return [
        Node(condition=UnlessCondition(lifecycle), **node),
        LifecycleNode(condition=IfCondition(lifecycle), **node),
    ]
