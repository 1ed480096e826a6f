"""A camera frame as every layer takes it: ingest makes it, models encode it, the memory stores it.

On the ground floor (next to ``pose``) so that a model adapter can name it without importing the
memory engine (``models/text_lm.py`` builds text frames); ``memory.question`` re-exports it with the
engine's request types.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from videokv_node.pose import Pose


@dataclass(slots=True)
class Frame:
    camera: str  # topic name
    stamp_ns: int  # header stamp
    rgb: np.ndarray  # (H, W, 3) uint8; for a text LM (models/text_lm.py) the frame's text, a str
    pose: Pose | None = None  # the robot's pose at stamp_ns (ingest/pose_history.py), if known
