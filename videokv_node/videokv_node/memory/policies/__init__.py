"""One module per memory policy; ``POLICY_CLASSES`` maps ``memory.policy`` names to classes."""

from videokv_node.memory.policies.full import FullPolicy
from videokv_node.memory.policies.hermes import HermesPolicy
from videokv_node.memory.policies.mukv import MuKVPolicy
from videokv_node.memory.policies.rekv import ReKVPolicy
from videokv_node.memory.policies.streamkv import StreamKVPolicy

POLICY_CLASSES = {cls.name: cls for cls in (FullPolicy, ReKVPolicy, StreamKVPolicy, HermesPolicy, MuKVPolicy)}

__all__ = ["FullPolicy", "HermesPolicy", "MuKVPolicy", "POLICY_CLASSES", "ReKVPolicy", "StreamKVPolicy"]
