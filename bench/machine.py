"""What the numbers were measured on: hardware, software, load, code version, date."""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch
import transformers


@dataclass(frozen=True, slots=True)
class Machine:
    cpu: str  # "model name" of /proc/cpuinfo
    cores: int  # logical CPUs this process may run on
    ram_gib: float
    gpu: str  # "no GPU" or the CUDA device's name
    torch: str
    torch_threads: int  # intra-op threads torch uses
    transformers: str
    python: str
    commit: str  # git HEAD, "+ uncommitted changes" when the tree is dirty
    date: str  # local time at the start of the run, ISO 8601
    load_start: tuple[float, float, float]  # 1/5/15-minute load averages when the run started


def describe(repo: Path) -> Machine:
    return Machine(
        cpu=_cpuinfo_field("model name"),
        cores=len(os.sched_getaffinity(0)),
        ram_gib=_meminfo_kib("MemTotal") / 2**20,
        gpu=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU",
        torch=torch.__version__,
        torch_threads=torch.get_num_threads(),
        transformers=transformers.__version__,
        python=platform.python_version(),
        commit=_commit(repo),
        date=datetime.now().astimezone().isoformat(timespec="seconds"),
        load_start=os.getloadavg(),
    )


def _cpuinfo_field(name: str) -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return platform.processor() or "unknown"


def _meminfo_kib(name: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == name:
            return int(value.split()[0])
    return 0


def _commit(repo: Path) -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return f"{head} + uncommitted changes" if dirty else head
