"""Memory that survives restarts: the snapshot format and the one way out and in (``format``:
``save_snapshot``, ``load_snapshot``), its file mechanics (``files``: names, atomic swaps,
checksums, hard links), a state dict packed into files (``pack``) and read back checked (``read``),
and periodic snapshots (``series``).

Never imports the engine: what it asks of it is ``format.Snapshottable``; both sides share
``memory/records/state.py``. Empty on purpose: import the module you need.
"""
