"""The process-wide settings (``process_settings.py``): torch's threads and the GIL's switch interval."""

import sys

import pytest
import torch

from videokv_node.config_base import ConfigError
from videokv_node.node_settings import NodeSettings
from videokv_node.process_settings import apply_process_settings


@pytest.fixture
def restored():
    """Put the interpreter's and torch's settings back after the test: they are process-wide."""
    interval, threads = sys.getswitchinterval(), torch.get_num_threads()
    yield
    sys.setswitchinterval(interval)
    torch.set_num_threads(threads)


def test_the_switch_interval_and_threads_are_applied(restored):
    sys.setswitchinterval(0.005)
    apply_process_settings(1, 0.0002)
    assert sys.getswitchinterval() == pytest.approx(0.0002)
    assert torch.get_num_threads() == 1


def test_nothing_given_leaves_python_and_torch_as_they_are(restored):
    sys.setswitchinterval(0.003)
    torch.set_num_threads(1)
    apply_process_settings(0, None)
    assert sys.getswitchinterval() == pytest.approx(0.003)
    assert torch.get_num_threads() == 1


def test_the_node_lowers_the_interval_by_default_within_its_range():
    assert NodeSettings().gil_switch_interval_s == pytest.approx(1e-4)  # docs/bench/load.md: 5 ms collapsed the node
    for bad in (0.0, -1e-4, 0.2):
        with pytest.raises(ConfigError, match="gil_switch_interval_s must be in"):
            NodeSettings(gil_switch_interval_s=bad)
