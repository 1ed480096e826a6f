"""The memory policies: the interface every policy implements (``base``), what a policy may ask of
the engine (``host``), one module per policy (``full``, ``rekv``, ``streamkv``, ``hermes``,
``mukv``), and the factory that picks one by ``memory.policy`` (``factory.make_policy``): a policy
declared in ``memory/config.py`` lives in the module of its name (``factory.policy_class``).

Empty on purpose: loading every policy whenever ``base`` is imported would load torch-heavy modules
that most importers do not need. Import the module you need.
"""
