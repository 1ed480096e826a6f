"""The factory: the one place a ``memory.policy`` name becomes a class.

The one registry is ``memory/config.py``'s declarations (``declare_policy``, ``policy_config``): a declared
policy ``<name>`` lives in ``memory/policies/<name>.py``, whose one ``MemoryPolicy`` subclass carries
``name = "<name>"``. No decorator and no import list: the module is imported by its name when first asked for.
"""

from __future__ import annotations

import importlib

from videokv_node.memory.config import POLICY_CONFIGS, ConfigError, MemoryConfig
from videokv_node.memory.policies.base import MemoryPolicy
from videokv_node.models.adapter import VideoLLMAdapter

PACKAGE = __name__.rpartition(".")[0]  # videokv_node.memory.policies: where a declared policy's module lives


def policy_class(name: str) -> type[MemoryPolicy]:
    """The class of the declared policy ``name``: the one ``MemoryPolicy`` subclass of ``<PACKAGE>.<name>`` whose
    ``name`` is ``name``. Raises ConfigError for an undeclared name, TypeError for a module without exactly one."""
    if name not in POLICY_CONFIGS:
        raise ConfigError(f"memory.policy must be one of {tuple(POLICY_CONFIGS)}, got {name!r}")
    module = importlib.import_module(f"{PACKAGE}.{name}")
    found = [c for c in vars(module).values()
             if isinstance(c, type) and issubclass(c, MemoryPolicy) and c.__module__ == module.__name__ and c.__dict__.get("name") == name]
    if len(found) != 1:
        raise TypeError(f"{module.__name__} must define exactly one MemoryPolicy subclass with name = {name!r}, found {len(found)}")
    return found[0]


def make_policy(config: MemoryConfig, adapter: VideoLLMAdapter) -> MemoryPolicy:
    """The only place a policy name is looked up."""
    return policy_class(config.policy)(config, adapter)


def policy_classes() -> dict[str, type[MemoryPolicy]]:
    """Every declared policy's class, in declaration order (tests and listings; imports every policy module)."""
    return {name: policy_class(name) for name in POLICY_CONFIGS}
