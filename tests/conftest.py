"""Shared fixtures. Tests import the library from the source tree, so they test what is checked in."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

# The tiny models are far too small for intra-op parallelism to pay; one thread per process
# also keeps the node subprocesses of the integration tests from oversubscribing 2 cores.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "videokv_node"))


def _worker_domain_ids() -> None:
    """Under pytest-xdist (`make test`, TEST_WORKERS), give each worker its own slice of VIDEOKV_DOMAIN_IDS.

    Every DDS domain a test takes comes from that range (programs/launcher.py's isolated_ros_env,
    also for the nodes it starts, which inherit the environment), so two workers never share a
    domain however their modules interleave: worker gwI of N takes the I-th of N equal slices.
    """
    lo_s, _, hi_s = os.environ.get("VIDEOKV_DOMAIN_IDS", "1-100").partition("-")
    lo, hi = int(lo_s), int(hi_s)
    # Fast DDS computes a domain's ports as 7400 + 250 * id + ...: above 232 they pass 65535 and
    # rcl's init fails (the test process exits without a word from pytest). Say so at once.
    if not 0 <= lo <= hi <= 232:
        raise pytest.UsageError(f"VIDEOKV_DOMAIN_IDS={lo}-{hi}: ROS domain ids must lie in 0-232 (Fast DDS ports)")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    index, count = int(worker.removeprefix("gw")), int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    size = (hi - lo + 1) // count
    if size < 1:
        raise pytest.UsageError(f"VIDEOKV_DOMAIN_IDS={lo}-{hi} has fewer ids than the {count} test workers")
    first = lo + index * size
    os.environ["VIDEOKV_DOMAIN_IDS"] = f"{first}-{first + size - 1}"


_worker_domain_ids()


@pytest.fixture(scope="session")
def tiny_adapter():
    from videokv_node.models.llava_onevision import LlavaOnevisionAdapter

    return LlavaOnevisionAdapter.tiny(seed=0)


@pytest.fixture(scope="session")
def tiny_adapter64():
    """The tiny model in float64: parity tests can then use tolerances of 1e-9."""
    from videokv_node.models.llava_onevision import LlavaOnevisionAdapter

    base = LlavaOnevisionAdapter.tiny(seed=0)
    return LlavaOnevisionAdapter(base.model.double(), base.tokenizer, name="tiny64")


@pytest.fixture(scope="session")
def tiny_qwen():
    """The tiny Qwen2.5-VL (mRoPE): every policy must work on both model families."""
    from videokv_node.models.qwen2_5_vl import Qwen25VLAdapter

    return Qwen25VLAdapter.tiny(seed=0)
