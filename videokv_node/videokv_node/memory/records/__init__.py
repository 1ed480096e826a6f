"""The engine's records at the bottom of memory/: settings, clocks and state errors that every layer above
may read (``memory/config.py``, ``question.py`` and ``stats.py``, the engine's face, sit on this floor too)."""
