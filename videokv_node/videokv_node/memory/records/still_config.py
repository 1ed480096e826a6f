"""The still-frame test's settings (``memory.redundancy.*``; ours, issue 36): a record of the config,
apart from the test itself (``memory/frames/still.py``) so that ``memory/config.py`` stays free of the engine."""

from __future__ import annotations

from dataclasses import dataclass

from videokv_node.config_base import ConfigError, param


@dataclass(slots=True)
class RedundancyConfig:
    """Still-frame merging at ingest (``memory.redundancy.*``; ours, issue 36)."""

    enabled: bool = param(True, "still frames: a frame whose grey thumbnail matches its camera's last stored frame is not encoded; that frame's block spans it instead (ours, issue 36; off: one block per frame as before)")
    max_cell_diff: float = param(4.0, "still frames: the largest change of any thumbnail cell (area mean of grey, 0-255) a still frame may show against the stored frame")
    max_mean_diff: float = param(1.0, "still frames: the largest mean absolute change over the thumbnail's cells (grey levels) a still frame may show")
    grid: int = param(32, "still frames: thumbnail cells along each side (fewer where the frame has fewer pixels); larger cells average more noise away but dilute a small thing")

    def __post_init__(self) -> None:
        for name in ("max_cell_diff", "max_mean_diff"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0.0 <= value <= 255.0):
                raise ConfigError(f"memory.redundancy.{name} must be in [0, 255] grey levels, got {value!r}")
        if self.grid < 1:
            raise ConfigError(f"memory.redundancy.grid must be >= 1, got {self.grid}")
