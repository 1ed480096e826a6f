# videokv on CPU: ROS 2 Jazzy from PyPI wheels in a venv, the same set-up CI runs.
#
#   docker build -t videokv .
#   docker run --rm --net=host -e ROS_DOMAIN_ID=7 videokv
#
# It runs scripts/setup_env.sh and scripts/build_ws.sh, exactly what `make test` runs in
# CI, so the image cannot drift from what CI checks. CPU only: a workstation/Jetson
# variant with CUDA and TensorRT is a later issue (it needs an NVIDIA base image and the
# matching torch build, not this one).
FROM python:3.11-slim-bookworm

# cmake and g++ build the interface package (rosidl generates C/C++); git for colcon's
# and pip's metadata; make for the Makefile and CMake.
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake g++ make git \
    && rm -rf /var/lib/apt/lists/*

# torch==2.13.0 from plain PyPI is the multi-GB CUDA build: take the CPU wheel instead
# (the pinned 2.13.0 matches its 2.13.0+cpu local version).
ENV PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

WORKDIR /opt/videokv

# Requirements first, so that a source change does not reinstall every wheel.
COPY requirements/ requirements/
COPY scripts/setup_env.sh scripts/setup_env.sh
RUN scripts/setup_env.sh

COPY . .
# A build context with a host .venv or ros2_ws/install in it would not match this image.
RUN rm -rf ros2_ws/build ros2_ws/install ros2_ws/log \
    && scripts/setup_env.sh \
    && scripts/build_ws.sh

# ROS_DOMAIN_ID is left to `docker run -e`; DDS discovery needs --net=host (or a
# shared network) to reach other machines' nodes.
CMD ["bash", "-c", ". ./env.sh && exec python -m videokv_node --ros-args --params-file config/memory.yaml"]
