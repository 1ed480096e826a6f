"""One module per memory policy; ``POLICY_CLASSES`` maps ``memory.policy`` names to classes."""

from videokv_node.memory.policies.full import FullPolicy
from videokv_node.memory.policies.rekv import ReKVPolicy

POLICY_CLASSES = {cls.name: cls for cls in (FullPolicy, ReKVPolicy)}

__all__ = ["FullPolicy", "ReKVPolicy", "POLICY_CLASSES"]
