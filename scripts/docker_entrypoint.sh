#!/usr/bin/env bash
# Entry point of the Docker image: the environment built by scripts/setup_env.sh and
# scripts/build_ws.sh at image build time, then the node. Installs and downloads nothing.
#
#   docker run ... videokv --ros-args -p model:=/models/x   the node, with these arguments
#   docker run ... videokv python -m videokv_node.programs.demo  any command, in the same environment
set -eo pipefail  # not -u: ROS 2's setup.bash reads unset variables

cd "$(dirname "${BASH_SOURCE[0]}")/.."
if [[ "${VIDEOKV_ROS:-wheels}" == system ]]; then
    # shellcheck disable=SC1090
    . "/opt/ros/${ROS_DISTRO:-jazzy}/setup.bash"
fi
# shellcheck disable=SC1091
. ./env.sh
if [[ $# -gt 0 && "$1" != -* ]]; then
    exec "$@"
fi
exec python -m videokv_node "$@"
