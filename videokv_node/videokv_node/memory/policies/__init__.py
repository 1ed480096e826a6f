"""One module per memory policy, each registering its class (``registry.register_policy``);
``POLICY_CLASSES`` maps ``memory.policy`` names to classes, one for every policy memory/config.py declares."""

from videokv_node.memory.policies.full import FullPolicy
from videokv_node.memory.policies.hermes import HermesPolicy
from videokv_node.memory.policies.mukv import MuKVPolicy
from videokv_node.memory.policies.registry import POLICY_CLASSES, check_complete
from videokv_node.memory.policies.rekv import ReKVPolicy
from videokv_node.memory.policies.streamkv import StreamKVPolicy

check_complete()

__all__ = ["FullPolicy", "HermesPolicy", "MuKVPolicy", "POLICY_CLASSES", "ReKVPolicy", "StreamKVPolicy"]
