"""The memory policies: the interface every policy implements (``base``), what a policy may ask of
the engine (``host``), one module per policy (``full``, ``rekv``, ``streamkv``, ``hermes``,
``mukv``), each registering its class (``registry.register_policy``), and the factory that picks
one by ``memory.policy`` (``factory.make_policy``, ``factory.POLICY_CLASSES``).

Empty on purpose: ``base`` is imported by modules that a policy imports in turn (``locate``), so
loading every policy whenever ``base`` is imported would make a cycle at import time. Import
the module you need.
"""
