"""The Dockerfile, checked without a Docker engine: by the set-up scripts it shares with CI.

Each variant's base stage only sets switches of scripts/setup_env.sh; the tests run
that script with each variant's switches (``--print-requirements``) and check that the
image's steps are CI's steps, that the entry point starts the node and installs
nothing, and that no build step fetches weights.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
ENTRYPOINT = REPO / "scripts" / "docker_entrypoint.sh"
GPU_REQUIREMENTS = REPO / "requirements" / "gpu.txt"
CI_REQUIREMENTS = ["requirements/base.txt", "requirements/test.txt", "requirements/ros-jazzy.txt"]
# What fetching weights or data at build time looks like.
DOWNLOADS = re.compile(r"huggingface|hf_hub|snapshot_download|from_pretrained|\bwget\b|\bcurl\b|\.safetensors|\.gguf|\.onnx\b|\.pth\b")


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (KEYWORD, arguments)

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for keyword, args in self.instructions:
            if keyword == "ENV":
                for item in shlex.split(args):
                    key, _, value = item.partition("=")
                    out[key] = value
        return out

    def runs(self) -> list[str]:
        return [args for keyword, args in self.instructions if keyword == "RUN"]


def parse(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages, continuation lines joined and comments dropped."""
    lines, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or not stripped:
            continue
        current += " " + stripped.removesuffix("\\").strip()
        if not stripped.endswith("\\"):
            lines.append(current.strip())
            current = ""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            base, _, name = rest.partition(" AS ")
            stages.append(Stage(base.strip(), name.strip()))
        elif keyword == "ARG" and not stages:
            key, _, value = rest.partition("=")
            args[key] = value
        elif stages:
            stages[-1].instructions.append((keyword, rest))
    return args, stages


@pytest.fixture(scope="module")
def dockerfile():
    args, stages = parse(DOCKERFILE.read_text())
    return args, {s.name: s for s in stages}, stages[-1]


def print_requirements(env: dict[str, str]) -> list[str]:
    """setup_env.sh's requirement files under a variant's switches (the rest of the environment cleared of them)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("VIDEOKV_")}
    out = subprocess.run([str(REPO / "scripts" / "setup_env.sh"), "--print-requirements"], env=clean | env,
                         capture_output=True, text=True, check=True)
    return out.stdout.split("\n")[:-1]


def test_three_variants_and_one_final_stage(dockerfile):
    args, stages, final = dockerfile
    assert {"base-cpu", "base-cuda", "base-jetson"} <= set(stages)
    assert final.base == "base-${VARIANT}" and args["VARIANT"] in ("cpu", "cuda", "jetson")
    assert stages["base-cuda"].base == "${CUDA_BASE}" and args["CUDA_BASE"].startswith("nvidia/cuda:")
    assert stages["base-jetson"].base == "${JETSON_BASE}"
    # The jetson base must bring ROS 2 Jazzy and JetPack's TensorRT and torch: checked at build time.
    jetson_checks = " ".join(stages["base-jetson"].runs())
    assert "/opt/ros/jazzy/setup.bash" in jetson_checks and "import tensorrt, torch" in jetson_checks


def test_the_image_runs_the_set_up_that_ci_runs(dockerfile):
    _, _, final = dockerfile
    runs = final.runs()
    assert any("scripts/setup_env.sh" in r for r in runs)
    last = runs[-1]
    assert last.index("scripts/setup_env.sh") < last.index("scripts/build_ws.sh")
    # No other installer in the shared steps: what CI checks is what the image gets.
    assert not [r for r in runs if re.search(r"\bpip\b|apt-get|colcon", r)], runs
    # CI's entry points are the same scripts (Makefile setup/build; make test depends on them).
    makefile = (REPO / "Makefile").read_text()
    assert "\tscripts/setup_env.sh" in makefile and "\tscripts/build_ws.sh" in makefile


def test_each_variant_installs_ci_requirements_plus_only_its_own(dockerfile):
    _, stages, _ = dockerfile
    env = {name: stages[f"base-{name}"].env() for name in ("cpu", "cuda", "jetson")}
    assert print_requirements(env["cpu"]) == CI_REQUIREMENTS == print_requirements({})
    assert print_requirements(env["cuda"]) == CI_REQUIREMENTS + ["requirements/gpu.txt"]
    # Jetson: ROS 2 and torch are the base image's (no aarch64 ROS wheels on PyPI, JetPack's CUDA torch).
    assert print_requirements(env["jetson"]) == ["requirements/base.txt without torch", "requirements/test.txt"]
    assert env["cpu"]["PIP_EXTRA_INDEX_URL"].endswith("/whl/cpu")


def test_cuda_variant_matches_tensorrt_cuda_major(dockerfile):
    """tensorrt pinned, x86_64 only, and built for the CUDA major of the base image and of torch's index."""
    args, stages, _ = dockerfile
    pins = {}
    for line in GPU_REQUIREMENTS.read_text().splitlines():
        requirement = line.split("#")[0].strip()
        if requirement:
            spec, _, marker = requirement.partition(";")
            name, _, version = spec.partition("==")
            assert version and 'platform_machine == "x86_64"' in marker, line
            pins[name.strip()] = version.strip()
    assert "tensorrt" in pins
    cuda_major = re.match(r"nvidia/cuda:(\d+)\.", args["CUDA_BASE"]).group(1)
    assert f"tensorrt-cu{cuda_major}" in pins
    assert stages["base-cuda"].env()["PIP_EXTRA_INDEX_URL"].endswith(f"/whl/cu{cuda_major}0")


def test_no_build_step_or_entry_point_fetches_weights_or_installs_at_launch(dockerfile):
    _, stages, _ = dockerfile
    for stage in stages.values():
        for run in stage.runs():
            assert not DOWNLOADS.search(run), run
    entry = ENTRYPOINT.read_text()
    code = "\n".join(line for line in entry.splitlines() if not line.lstrip().startswith("#"))
    assert not DOWNLOADS.search(code) and not re.search(r"\bpip\b|apt-get|setup_env|build_ws", code)


def test_entrypoint_starts_the_node(dockerfile):
    _, _, final = dockerfile
    instructions = dict(final.instructions)
    assert instructions["ENTRYPOINT"] == '["scripts/docker_entrypoint.sh"]'
    assert "--params-file" in instructions["CMD"] and "config/memory.yaml" in instructions["CMD"]
    assert "exec python -m videokv_node \"$@\"" in ENTRYPOINT.read_text()
    assert os.access(ENTRYPOINT, os.X_OK)


needs_ros = pytest.mark.skipif(not (REPO / "ros2_ws" / "install" / "videokv_interfaces").is_dir() or not (REPO / ".venv").exists(),
                               reason="needs the set-up environment and ros2_ws built (make build)")


def _entrypoint(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess:
    from videokv_node.programs.launcher import isolated_ros_env

    env = {k: v for k, v in isolated_ros_env().items() if not k.startswith("VIDEOKV_ROS")}
    return subprocess.run([str(ENTRYPOINT), *args], env=env, capture_output=True, text=True, timeout=timeout)


@needs_ros
def test_entrypoint_runs_a_command_in_the_built_environment():
    out = _entrypoint("python", "-c", "import rclpy, videokv_interfaces.srv, videokv_node; print('ready')")
    assert out.returncode == 0 and out.stdout.strip() == "ready", out.stderr


@needs_ros
def test_entrypoint_passes_its_arguments_to_the_node():
    """A configuration the node refuses at once: the node ran, read the arguments and said why."""
    out = _entrypoint("--ros-args", "--params-file", "config/memory.yaml", "-p", "image_topics:=['']")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "cannot start: image_topics and compressed_topics are both empty" in out.stdout + out.stderr
