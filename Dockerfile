# syntax=docker/dockerfile:1
# videokv in a container: ROS 2 Jazzy, the node, set up by the same scripts CI runs.
#
#   docker build -t videokv:cuda .                          # x86_64 workstation: CUDA 13 + TensorRT (default)
#   docker build -t videokv:cpu --build-arg VARIANT=cpu .   # x86_64, CPU only (what CI's set-up gives)
#   docker build -t videokv:jetson --build-arg VARIANT=jetson .   # on a Jetson (L4T, aarch64)
#   docker run --rm --net=host --ipc=host --gpus all -e ROS_DOMAIN_ID=7 videokv:cuda
#
# Every variant runs scripts/setup_env.sh and scripts/build_ws.sh, exactly what `make test`
# runs in CI, so the image cannot drift from what CI checks; the variants differ only in
# their base stage and the set-up's switches (documented in scripts/setup_env.sh):
#
#   cpu     python:3.11 (Debian), ROS 2 Jazzy from PyPI wheels, torch's CPU wheel. CI's set-up.
#   cuda    nvidia/cuda (Ubuntu 24.04) with Python 3.11, ROS 2 Jazzy from PyPI wheels, torch's
#           CUDA 13 wheel, TensorRT from requirements/gpu.txt (CUDA 13 build). The driver comes
#           from the host (NVIDIA Container Toolkit: `--gpus all`).
#   jetson  JETSON_BASE: an L4T (JetPack 6) image that already holds ROS 2 Jazzy in /opt/ros/jazzy
#           and JetPack's CUDA, TensorRT and torch (PyPI has no aarch64 ROS 2 wheels, and torch
#           for Jetson's GPU is JetPack's build). The set-up uses those (VIDEOKV_ROS=system,
#           VIDEOKV_TORCH=system) and installs the rest of the pinned requirements.
#
# Nothing is installed or downloaded when the container starts (scripts/docker_entrypoint.sh
# only sources the environment and starts the node), and no weights are fetched at build
# time either: mount a checkpoint directory and pass `-p model:=/models/...`.
# tests/unit/test_dockerfile.py checks these properties; there is no Docker engine in CI.

ARG VARIANT=cuda
# CUDA 13 to match requirements/gpu.txt's TensorRT (tensorrt-cu13) and torch's cu130 wheel.
ARG CUDA_BASE=nvidia/cuda:13.0.1-base-ubuntu24.04
# Any L4T image with ROS 2 Jazzy (/opt/ros/jazzy), TensorRT and JetPack's torch; the default
# is jetson-containers' ROS build for JetPack 6.1. Pick the tag matching your L4T release.
ARG JETSON_BASE=dustynv/ros:jazzy-ros-base-r36.4.0

# --- cpu: CI's set-up ------------------------------------------------------------------
FROM python:3.11-slim-bookworm AS base-cpu
# cmake and g++ build the interface package (rosidl generates C/C++); git for colcon's
# and pip's metadata; make for the Makefile and CMake.
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake g++ make git \
    && rm -rf /var/lib/apt/lists/*
# torch==2.13.0 from plain PyPI is the multi-GB CUDA build: take the CPU wheel instead
# (the pinned 2.13.0 matches its 2.13.0+cpu local version).
ENV PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu \
    PYTHON=python3 \
    VIDEOKV_ROS=wheels \
    VIDEOKV_TORCH=pinned \
    VIDEOKV_EXTRA_REQUIREMENTS=""

# --- cuda: x86_64 workstation -------------------------------------------------------------
FROM ${CUDA_BASE} AS base-cuda
# Python 3.11, the interpreter the ROS 2 wheels and CI use (Ubuntu 24.04 ships 3.12), from
# the deadsnakes archive, with its venv and C headers (rosidl builds a C extension).
RUN apt-get update \
    && apt-get install -y --no-install-recommends software-properties-common gpg-agent \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get update \
    && apt-get install -y --no-install-recommends \
        python3.11 python3.11-venv python3.11-dev cmake g++ make git \
    && rm -rf /var/lib/apt/lists/*
# The pinned torch==2.13.0 resolves to its CUDA 13 build (2.13.0+cu130).
ENV PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cu130 \
    PYTHON=python3.11 \
    VIDEOKV_ROS=wheels \
    VIDEOKV_TORCH=pinned \
    VIDEOKV_EXTRA_REQUIREMENTS=requirements/gpu.txt \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# --- jetson: L4T, aarch64 -----------------------------------------------------------------
FROM ${JETSON_BASE} AS base-jetson
RUN test -f /opt/ros/jazzy/setup.bash \
        || { echo "JETSON_BASE has no /opt/ros/jazzy: pick an L4T image with ROS 2 Jazzy" >&2; exit 1; } \
    && python3 -c 'import tensorrt, torch' \
    && apt-get update \
    && apt-get install -y --no-install-recommends cmake g++ make git python3-venv python3-dev \
    && rm -rf /var/lib/apt/lists/*
ENV PYTHON=python3 \
    VIDEOKV_ROS=system \
    VIDEOKV_TORCH=system \
    VIDEOKV_EXTRA_REQUIREMENTS=""

# --- the image: the same steps for every variant --------------------------------------------
FROM base-${VARIANT} AS videokv
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1
# bash: ROS 2's setup.bash (jetson) is sourced in the same shell as the scripts.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /opt/videokv

# Requirements first, so that a source change does not reinstall every wheel.
COPY requirements/ requirements/
COPY scripts/setup_env.sh scripts/setup_env.sh
RUN if [[ "$VIDEOKV_ROS" == system ]]; then . /opt/ros/jazzy/setup.bash; fi \
    && scripts/setup_env.sh

COPY . .
# A build context with a host .venv or ros2_ws/install in it would not match this image.
RUN rm -rf ros2_ws/build ros2_ws/install ros2_ws/log \
    && if [[ "$VIDEOKV_ROS" == system ]]; then . /opt/ros/jazzy/setup.bash; fi \
    && scripts/setup_env.sh \
    && scripts/build_ws.sh

# ROS_DOMAIN_ID is left to `docker run -e`; DDS discovery needs --net=host (or a shared
# network) to reach other machines' nodes, and --ipc=host for Fast DDS's shared memory
# with nodes in other containers on the same machine. Arguments are the node's:
#   docker run ... videokv:cuda --ros-args --params-file config/memory.yaml -p model:=/models/x
ENTRYPOINT ["scripts/docker_entrypoint.sh"]
CMD ["--ros-args", "--params-file", "config/memory.yaml"]
