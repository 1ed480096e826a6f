#!/usr/bin/env bash
# Builds ros2_ws (videokv_interfaces, videokv_node) with colcon against the ROS 2 wheels
# in .venv, into ros2_ws/{build,install,log}. Run scripts/setup_env.sh first.
#
# Skipped when nothing that the build reads has changed since the last successful build:
# a stamp in ros2_ws/install holds a hash of the interface files, both package manifests,
# setup.py/setup.cfg, the launch/ and config/ files and the venv's requirements stamp.
#
# --symlink-install: colcon links the installed launch/config files and the python
# package back to the sources, so edits to them need no rebuild (a new launch/config
# file does, and the hash sees it). It needs setuptools < 80 (`setup.py develop`),
# which requirements/base.txt pins. env.sh does not rely on it for the python code: it
# puts the source tree videokv_node/ first on PYTHONPATH, so the python package is not
# an input of this build at all.
#
# Set VIDEOKV_FORCE_BUILD=1 to build regardless of the stamp.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
WS="$ROOT/ros2_ws"
STAMP="$WS/install/.videokv-build.sha256"

say() { printf '[build] %s\n' "$*"; }
die() { printf '[build] error: %s\n' "$*" >&2; exit 1; }

COLCON="$VENV/bin/colcon"
if [[ "${VIDEOKV_ROS:-wheels}" == system && ! -x "$COLCON" ]]; then
    COLCON="$(command -v colcon || true)"   # ROS 2 from /opt/ros (setup_env.sh): its colcon
fi
[[ -n "$COLCON" && -x "$COLCON" ]] || die "no colcon in $VENV; run scripts/setup_env.sh (or make setup) first"

# Inputs of the build, as (path, content hash) lines; -L follows the videokv_node symlinks.
inputs_hash() {
    (
        cd "$ROOT"
        find -L ros2_ws/src \
            \( -name build -o -name install -o -name log -o -name __pycache__ \
               -o -name '*.egg-info' -o -path 'ros2_ws/src/videokv_node/videokv_node' \) -prune \
            -o -type f -print \
            | LC_ALL=C sort | xargs -r -d '\n' sha256sum
        cat "$VENV/.videokv-requirements.sha256" 2>/dev/null || true
        printf 'build_ws.sh %s\n' "$(sha256sum <"$ROOT/scripts/build_ws.sh")"
    ) | sha256sum | cut -d' ' -f1
}

want="$(inputs_hash)"
if [[ "${VIDEOKV_FORCE_BUILD:-0}" != 1 && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    say "ros2_ws unchanged since the last build, skipping"
    exit 0
fi

# The venv's interpreter and the wheels' prefix, without sourcing activate (set -u safe).
export VIRTUAL_ENV="$VENV"
export PATH="$VENV/bin:$PATH"
# The wheels' prefix is the venv itself; it has no local_setup files, so colcon warns
# about it once: harmless.
export AMENT_PREFIX_PATH="$VENV${AMENT_PREFIX_PATH:+:$AMENT_PREFIX_PATH}"
export CMAKE_PREFIX_PATH="$VENV${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
# The venv's ROS libraries and the wheels' vendored ones (ros_*.libs) for the generators
# that load them; setting the guard skips ros-wheels-bootstrapper's re-exec.
ld="$VENV/lib"
for d in "$VENV"/lib/python3*/site-packages/ros_*.libs; do
    [[ -d "$d" ]] && ld="$ld:$d"
done
export LD_LIBRARY_PATH="$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export _ROS_WHEELS_BOOTSTRAP_COMPLETE=1

rm -f "$STAMP"
say "colcon build of ros2_ws (log: ros2_ws/log/latest_build)"
start=$SECONDS
cd "$WS"
# A launch/config file removed from the sources leaves a dangling symlink behind in
# build/ and install/, and colcon's symlink_data step then fails on it: drop those.
for d in build install; do
    [[ -d "$d" ]] && find "$d" -xtype l -delete
done
# status-: no live status line (it floods CI logs). A failing package's full output is
# printed below.
if ! "$COLCON" build \
        --symlink-install \
        --base-paths src \
        --build-base build --install-base install \
        --event-handlers status- \
        --cmake-args -DPython3_EXECUTABLE="$VENV/bin/python" -DBUILD_TESTING=OFF; then
    # colcon leaves each package's exit status in build/<pkg>/colcon_build.rc.
    for rc in build/*/colcon_build.rc; do
        pkg="$(basename "$(dirname "$rc")")"
        f="log/latest_build/$pkg/stdout_stderr.log"
        if [[ "$(cat "$rc")" != 0 && -f "$f" ]]; then
            printf '%s\n' "----- $pkg: last 60 lines of ros2_ws/$f"
            tail -n 60 "$f"
        fi
    done
    die "colcon build failed; logs in ros2_ws/log/latest_build/"
fi
printf '%s\n' "$want" >"$STAMP"
say "built in $((SECONDS - start)) s"
