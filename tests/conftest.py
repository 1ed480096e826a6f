"""Shared fixtures. Tests import the library from the source tree, so they test what is checked in."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

# The tiny models are far too small for intra-op parallelism to pay; one thread per process
# also keeps the node subprocesses of the integration tests from oversubscribing 2 cores.
torch.set_num_threads(1)

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "videokv_node"))


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
