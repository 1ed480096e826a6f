"""Text streams from JSONL files: one frame per line, ``{"stamp": seconds, "text": "..."}``.

Every bad line is refused with its file and line number, before any frame reaches a model:
an evaluation never runs on half a stream. Blank lines are skipped. Stamps must increase
strictly, as frames of one camera do.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path


class TextStreamError(ValueError):
    """A text stream file that cannot be read; the message names the file and the line."""


@dataclass(frozen=True, slots=True)
class TextFrameRecord:
    stamp_s: float  # seconds from the start of the stream
    text: str  # what the frame says, as written in the file


def load_text_frames(path: str | Path) -> list[TextFrameRecord]:
    """The frames of ``path`` in file order (stamps strictly increasing), or TextStreamError."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise TextStreamError(f"{path}: cannot read the text stream: {exc}") from exc
    frames: list[TextFrameRecord] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        frame = _parse(line, f"{path}:{number}")
        if frames and frame.stamp_s <= frames[-1].stamp_s:
            raise TextStreamError(f"{path}:{number}: stamp {frame.stamp_s} is not after the previous {frames[-1].stamp_s}")
        frames.append(frame)
    if not frames:
        raise TextStreamError(f"{path}: no frames (expected one JSON object per line)")
    return frames


def _parse(line: str, where: str) -> TextFrameRecord:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TextStreamError(f"{where}: not JSON ({exc.msg})") from exc
    if not isinstance(obj, dict):
        raise TextStreamError(f"{where}: expected an object {{\"stamp\": seconds, \"text\": \"...\"}}, got {type(obj).__name__}")
    missing = [k for k in ("stamp", "text") if k not in obj]
    if missing:
        raise TextStreamError(f"{where}: missing {', '.join(missing)}")
    stamp, text = obj["stamp"], obj["text"]
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not math.isfinite(stamp) or stamp < 0:
        raise TextStreamError(f"{where}: stamp must be a finite number of seconds >= 0, got {stamp!r}")
    if not isinstance(text, str) or not text.strip():
        raise TextStreamError(f"{where}: text must be a non-empty string, got {text!r}")
    return TextFrameRecord(float(stamp), text)
