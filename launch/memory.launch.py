"""Start the videokv node with config/memory.yaml, or your own params file.

    ros2 launch videokv_node memory.launch.py
    ros2 launch videokv_node memory.launch.py model:=/models/llava-onevision-qwen2-0.5b-ov-hf \
        image_topic:=/camera/color/image_raw policy:=rekv use_sim_time:=true
    ros2 launch videokv_node memory.launch.py policy:=streamkv question_stage:=tgvkv
    ros2 launch videokv_node memory.launch.py lifecycle:=true   # then: ros2 lifecycle set /videokv configure
    ros2 launch videokv_node memory.launch.py pose_topic:=/odom  # store the robot's pose with every frame
    ros2 launch videokv_node memory.launch.py memory_dir:=/var/lib/videokv  # crash-safe: snapshots, restored at start
    ros2 launch videokv_node memory.launch.py params_file:=robot.yaml  # every value as robot.yaml says

What is guaranteed: a launch argument sets its parameter only when it is given (not empty);
left empty (every default is) it sets nothing, so the params file's value stands, and where
the file has none, the node's own default. Given, it wins over the file (the launch passes it
after the file). `lifecycle` also picks the launch action: given, by its value; not given, by
the params file's `lifecycle` for this node (the node's main reads the same parameter, so the
process and the action agree). `image_topic` given sets `image_topics` to that one topic.
`memory_dir` given turns on crash-safe memory: `memory.snapshot_dir` (the directory),
`memory.restore_on_start: latest` and a period of snapshots (node clock): `snapshot_period_s`
if given, else the file's if it sets one above 0, else DEFAULT_SNAPSHOT_PERIOD_S
(docs/OPERATIONS.md, "Running all day"). The camera QoS is left to the params file (sensor_data
by default, as in the node), so the launch default and the node default always agree.
Every argument is documented in the README.
"""

import yaml
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import LifecycleNode, Node
from launch_ros.substitutions import FindPackageShare

# The choices, from where they are declared (a light import: the memory package loads its engine lazily).
from videokv_node.memory.config import POLICIES, QUESTION_STAGES

NODE_NAME = "videokv"
DEFAULT_SNAPSHOT_PERIOD_S = 60.0  # memory_dir given, no period from the argument or the file
# Launch argument -> (the parameter it sets when given, its type). image_topic and memory_dir set more: _overrides.
PARAMETERS = {
    "model": ("model", str),
    "policy": ("memory.policy", str),
    "question_stage": ("memory.question_stage", str),
    "pose_topic": ("pose_topic", str),
    "use_sim_time": ("use_sim_time", bool),
    "lifecycle": ("lifecycle", bool),
    "snapshot_period_s": ("memory.snapshot_period_s", float),
}
_UNSET = " Empty (the default): as the params file says."


def _either(choices: tuple[str, ...]) -> str:
    return ", ".join(choices[:-1]) + " or " + choices[-1]


def generate_launch_description() -> LaunchDescription:
    default_params = PathJoinSubstitution([FindPackageShare("videokv_node"), "config", "memory.yaml"])
    args = [
        DeclareLaunchArgument("namespace", default_value="", description="namespace of the node"),
        DeclareLaunchArgument("params_file", default_value=default_params, description="parameter file"),
        DeclareLaunchArgument("model", default_value="",
                              description="'videokv-tiny' (self-trained, sees for real; the node's default), 'tiny' or "
                                          "'tiny-qwen2.5-vl' (random weights, for tests), or a local checkpoint directory." + _UNSET),
        DeclareLaunchArgument("policy", default_value="",
                              description=f"memory policy: {_either(POLICIES)}." + _UNSET),
        DeclareLaunchArgument("question_stage", default_value="",
                              description=f"question-time stage: {_either(QUESTION_STAGES)}." + _UNSET),
        DeclareLaunchArgument("image_topic", default_value="",
                              description="the one camera topic (sets image_topics to [it])." + _UNSET),
        DeclareLaunchArgument("pose_topic", default_value="",
                              description="robot pose topic (nav_msgs/Odometry, geometry_msgs/PoseStamped or "
                                          "PoseWithCovarianceStamped) stored with every frame." + _UNSET),
        DeclareLaunchArgument("use_sim_time", default_value="",
                              description="true: follow /clock (bag replay, simulation); false: the system clock." + _UNSET),
        DeclareLaunchArgument("lifecycle", default_value="",
                              description="true: a managed (lifecycle) node, unconfigured until configure; false: the plain "
                                          "node." + _UNSET),
        DeclareLaunchArgument("memory_dir", default_value="",
                              description="crash-safe memory: periodic snapshots into this directory, the newest good one "
                                          "restored at start." + _UNSET),
        DeclareLaunchArgument("snapshot_period_s", default_value="",
                              description="seconds (node clock) between periodic snapshots; with memory_dir and empty: the "
                                          f"params file's if above 0, else {DEFAULT_SNAPSHOT_PERIOD_S}." + _UNSET),
    ]
    return LaunchDescription(args + [OpaqueFunction(function=_nodes)])


def _nodes(context):
    """The node, plain or lifecycle, with the parameters of the arguments given (and only those)."""
    given = {name: LaunchConfiguration(name).perform(context).strip() for name in (*PARAMETERS, "image_topic", "memory_dir")}
    namespace = LaunchConfiguration("namespace").perform(context)
    params_file = LaunchConfiguration("params_file").perform(context)
    fqn = "/" + "/".join(p for p in (*namespace.split("/"), NODE_NAME) if p)
    overrides = _overrides(given, lambda name: file_parameter(params_file, fqn, name))
    lifecycle = overrides.get("lifecycle", file_parameter(params_file, fqn, "lifecycle") is True)
    action = LifecycleNode if lifecycle else Node
    # sigterm_timeout: on Ctrl-C the node writes memory.snapshot_on_shutdown and releases the model before it
    # exits; launch's 5 s before escalating to SIGTERM cut that short on a loaded machine (seen on 2 shared cores).
    return [action(package="videokv_node", executable="videokv_node", name=NODE_NAME,
                   namespace=LaunchConfiguration("namespace"), output="screen", emulate_tty=True,
                   sigterm_timeout="30", parameters=[LaunchConfiguration("params_file"), overrides])]


def _overrides(given: dict[str, str], from_file) -> dict:
    """The parameters the given arguments set (``given``: argument -> its text, "" when not given);
    ``from_file(name)``: the params file's value of a parameter for this node, None if it has none."""
    out = {}
    for argument, (parameter, kind) in PARAMETERS.items():
        if given[argument]:
            out[parameter] = _typed(argument, given[argument], kind)
    if given["image_topic"]:
        out["image_topics"] = [given["image_topic"]]
    if given["memory_dir"]:
        if "memory.snapshot_period_s" not in out:  # given, it stands as given (0: restore only, no periodic snapshots)
            in_file = from_file("memory.snapshot_period_s")
            out["memory.snapshot_period_s"] = in_file if isinstance(in_file, float) and in_file > 0 else DEFAULT_SNAPSHOT_PERIOD_S
        out.update({"memory.snapshot_dir": given["memory_dir"], "memory.restore_on_start": "latest"})
    return out


def _typed(argument: str, text: str, kind: type):
    """A given argument's text as its parameter's type; ValueError naming the argument when it is not one."""
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise ValueError(f"launch argument {argument}:={text!r} must be true or false")
        return text.lower() == "true"
    if kind is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"launch argument {argument}:={text!r} must be a number") from None
    return text


def file_parameter(path: str, node_fqn: str, name: str):
    """The value the ROS params file ``path`` gives the parameter ``name`` (dotted) of the node ``node_fqn``,
    or None when it gives none or cannot be read (the node then reports the file itself).

    Matched as rclpy matches a file to a node: the sections ``/**``, ``/*`` and the node's fully
    qualified name (a leading ``/`` optional), a later one winning; nested keys and dotted keys alike.
    """
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(doc, dict):
        return None
    sections = {"/" + str(key).lstrip("/"): value for key, value in doc.items()}
    value = None
    for key in ("/**", "/*", node_fqn):
        params = (sections.get(key) or {}).get("ros__parameters") if isinstance(sections.get(key), dict) else None
        if isinstance(params, dict):
            value = _flatten(params).get(name, value)
    return value


def _flatten(params: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in params.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
