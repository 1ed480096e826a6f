# Environment for the pip-wheels set-up of videokv (ROS 2 Jazzy from PyPI, in .venv).
# Source it from bash, after `make build`:    . ./env.sh
#
# Then `python -c "import rclpy, videokv_interfaces.srv, videokv_node"` works (and `import tf2_ros`
# where `make build` assembled .ros2tools from ../shared/ros2tools) and
# `python -m videokv_node --ros-args ...` can start. Safe to source twice (no path is
# added twice) and with ROS 2 already sourced (its paths stay, after ours).
# ROS_DOMAIN_ID and ROS_AUTOMATIC_DISCOVERY_RANGE are left to the user.
#
# On a robot with ROS 2 from apt, do not use this file: `source /opt/ros/jazzy/setup.bash`,
# build ros2_ws with colcon and `source ros2_ws/install/setup.bash` (see docs/OPERATIONS.md).

# Not `set -e`/`-u` here: this file runs in the caller's shell.
if ! (return 0 2>/dev/null); then
    echo "env.sh: source it, do not run it:  . ./env.sh" >&2
    exit 1
fi
_videokv_root="$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")" && pwd)"
_videokv_venv="$_videokv_root/.venv"
_videokv_install="$_videokv_root/ros2_ws/install"

if [[ ! -x "$_videokv_venv/bin/python" ]]; then
    echo "env.sh: no $_videokv_venv; run 'make build' first" >&2
    unset _videokv_root _videokv_venv _videokv_install
    return 1
fi
if [[ ! -d "$_videokv_install/videokv_interfaces" ]]; then
    echo "env.sh: ros2_ws is not built; run 'make build' first" >&2
fi

# _videokv_prepend VAR DIR: put DIR first in the colon list VAR, once.
_videokv_prepend() {
    local var="$1" dir="$2" cur
    cur=":${!var-}:"
    cur="${cur//:$dir:/:}"
    cur="${cur#:}"
    cur="${cur%:}"
    printf -v "$var" '%s' "$dir${cur:+:$cur}"
    export "${var?}"
}

# activate's own deactivate/PS1 handling is kept; sourcing it twice is harmless.
# shellcheck disable=SC1091
. "$_videokv_venv/bin/activate"

_videokv_sites=("$_videokv_venv"/lib/python3*/site-packages)
_videokv_site="${_videokv_sites[0]}"
_videokv_pyver="$(basename "$(dirname "$_videokv_site")")"   # python3.X

# Shared libraries: the wheels' (venv/lib), their vendored ones (ros_*.libs: tinyxml2,
# ...), and the interface package's generated type supports, which rclpy dlopen()s.
# ros-wheels-bootstrapper would otherwise re-exec every python to set the first two;
# the guard variable tells it this is done.
_videokv_prepend LD_LIBRARY_PATH "$_videokv_venv/lib"
for _videokv_d in "$_videokv_site"/ros_*.libs; do
    [[ -d "$_videokv_d" ]] && _videokv_prepend LD_LIBRARY_PATH "$_videokv_d"
done
export _ROS_WHEELS_BOOTSTRAP_COMPLETE=1

# ament index: where get_package_share_directory() and rclpy find packages. The venv
# holds the wheels' packages; the workspace prefixes come first so they win.
_videokv_prepend AMENT_PREFIX_PATH "$_videokv_venv"
_videokv_prepend CMAKE_PREFIX_PATH "$_videokv_venv"
# tf2's Python stack (import tf2_ros: pose_source tf), which `make build` builds from ../shared/ros2tools
# into .ros2tools for the wheels: only its tf2 packages come onto the paths here; the rest of that
# overlay (launch, ros2cli and their pip dependencies) stays behind `. .ros2tools/env.sh`.
for _videokv_pkg in tf2 tf2_msgs tf2_py tf2_ros_py videokv_interfaces videokv_node; do
    _videokv_prefix="$_videokv_install/$_videokv_pkg"
    [[ "$_videokv_pkg" == tf2* ]] && _videokv_prefix="$_videokv_root/.ros2tools/ws/install/$_videokv_pkg"
    [[ -d "$_videokv_prefix" ]] || continue
    _videokv_prepend AMENT_PREFIX_PATH "$_videokv_prefix"
    _videokv_prepend CMAKE_PREFIX_PATH "$_videokv_prefix"
    [[ -d "$_videokv_prefix/lib" ]] && _videokv_prepend LD_LIBRARY_PATH "$_videokv_prefix/lib"
    [[ -d "$_videokv_prefix/lib/$_videokv_pyver/site-packages" ]] \
        && _videokv_prepend PYTHONPATH "$_videokv_prefix/lib/$_videokv_pyver/site-packages"
done
# A ROS 2 sourced from /opt/ros puts its own rclpy (built for the system Python) on
# PYTHONPATH, which Python searches before the venv's site-packages: put the venv's
# first so that the wheels and the interpreter stay a matching pair.
case ":${PYTHONPATH-}:${AMENT_PREFIX_PATH-}:" in
    *:/opt/ros/*)
        echo "env.sh: note: a ROS 2 from /opt/ros is sourced too; the venv's ROS wheels take precedence" >&2
        _videokv_prepend PYTHONPATH "$_videokv_site"
        ;;
esac
# The console script `videokv_node` (what `ros2 launch` and `ros2 run` start) finds its entry point
# through the package metadata, which colcon's symlink install leaves in the build directory
# (its pythonpath_develop hook, which env.sh does not run, would add it): add it here.
if [[ -d "$_videokv_root/ros2_ws/build/videokv_node/videokv_node.egg-info" ]]; then
    _videokv_prepend PYTHONPATH "$_videokv_root/ros2_ws/build/videokv_node"
fi
# The python package from the source tree, first: edits need no rebuild.
_videokv_prepend PYTHONPATH "$_videokv_root/videokv_node"

# The RMW the wheels ship; a user's choice is kept.
export RMW_IMPLEMENTATION="${RMW_IMPLEMENTATION:-rmw_fastrtps_cpp}"
# ROS_DOMAIN_ID: deliberately untouched (the user's, or rclpy's default 0).

unset _videokv_root _videokv_venv _videokv_install _videokv_sites _videokv_site _videokv_pyver \
    _videokv_d _videokv_pkg _videokv_prefix
unset -f _videokv_prepend
