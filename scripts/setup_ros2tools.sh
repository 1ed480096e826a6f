#!/usr/bin/env bash
# The real `ros2` CLI (launch, service, param, lifecycle, action, topic) for the pip-wheels set-up:
# ../shared/ros2tools (next to the project in every developer's and CI's checkout) assembles the
# pure-Python launch, launch_ros and ros2cli packages into .ros2tools/ (idempotent; its own stamp).
# Absent: nothing to do, and the tests that drive the launch file through `ros2 launch` skip with
# that reason. On a robot with ROS 2 from apt, these tools come with ROS and this is not needed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/../shared/ros2tools/setup.sh"
if [[ ! -x "$TOOLS" ]]; then
    echo "[ros2tools] $TOOLS absent: the real-launch tests will skip"
    exit 0
fi
exec "$TOOLS" "$ROOT/.venv" "$ROOT/.ros2tools"
