"""The engine's two configs, held once and shared by its collaborators (the pipeline, the reader, the locator).

Why one object: ``memory.budget_tokens`` and the other run-time fields change between frames
(``VideoMemoryEngine.reconfigure``), and a bench may replace the generation config between questions; every
collaborator reads the current one through this holder, never a copy taken at start.
"""

from __future__ import annotations

from dataclasses import dataclass

from videokv_node.memory.config import GenerationConfig, MemoryConfig


@dataclass(slots=True)
class EngineSettings:
    """What the engine runs under now; changed by the engine only (``reconfigure``, or its ``config`` and
    ``generation`` attributes set), read by its collaborators when they need it."""

    memory: MemoryConfig  # as adapted to the model (``fit_to_model``)
    generation: GenerationConfig
