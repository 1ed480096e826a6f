"""The factory: every policy module imported (each registers its class, ``registry.register_policy``);
``POLICY_CLASSES`` maps ``memory.policy`` names to classes, one for every policy memory/config.py declares."""

from videokv_node.memory.config import MemoryConfig
from videokv_node.memory.policies.base import MemoryPolicy
from videokv_node.memory.policies.full import FullPolicy
from videokv_node.memory.policies.hermes import HermesPolicy
from videokv_node.memory.policies.mukv import MuKVPolicy
from videokv_node.memory.policies.registry import POLICY_CLASSES, check_complete
from videokv_node.memory.policies.rekv import ReKVPolicy
from videokv_node.memory.policies.streamkv import StreamKVPolicy
from videokv_node.models.adapter import VideoLLMAdapter

check_complete()


def make_policy(config: MemoryConfig, adapter: VideoLLMAdapter) -> MemoryPolicy:
    """The only place a policy name is looked up."""
    return POLICY_CLASSES[config.policy](config, adapter)


__all__ = ["FullPolicy", "HermesPolicy", "MuKVPolicy", "POLICY_CLASSES", "ReKVPolicy", "StreamKVPolicy", "make_policy"]
