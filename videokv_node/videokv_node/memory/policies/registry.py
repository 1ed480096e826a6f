"""The memory policy classes by ``memory.policy`` name: each policy module registers its class here.

A policy is declared once with its hyper-parameters in ``memory/config.py`` (``policy_config``:
that gives ``POLICIES``, ``MemoryConfig``'s section and the node's parameters); its class, in a
module of this package, carries the same ``name`` and registers itself with ``@register_policy``.
``memory/policies/factory.py`` checks that every declared policy has exactly one class.
"""

from __future__ import annotations

from videokv_node.memory.config import POLICY_CONFIGS

POLICY_CLASSES: dict[str, type] = {}  # memory.policy name -> its MemoryPolicy subclass; filled by register_policy only


def register_policy(cls: type) -> type:
    """Class decorator: ``cls`` is the policy ``cls.name``, declared in memory/config.py; one class per name."""
    name = getattr(cls, "name", None)
    if name not in POLICY_CONFIGS:
        raise TypeError(f"{cls.__name__}.name {name!r} is not a policy declared in memory/config.py (policy_config): "
                        f"one of {tuple(POLICY_CONFIGS)}")
    if name in POLICY_CLASSES:
        raise TypeError(f"memory policy {name!r} registered twice: {POLICY_CLASSES[name].__name__} and {cls.__name__}")
    POLICY_CLASSES[name] = cls
    return cls


def check_complete() -> None:
    """Raise unless every declared policy has registered its class; then order POLICY_CLASSES as declared."""
    missing = [name for name in POLICY_CONFIGS if name not in POLICY_CLASSES]
    if missing:
        raise TypeError(f"memory policies declared in memory/config.py without a registered class: {missing}")
    ordered = {name: POLICY_CLASSES[name] for name in POLICY_CONFIGS}
    POLICY_CLASSES.clear()
    POLICY_CLASSES.update(ordered)
