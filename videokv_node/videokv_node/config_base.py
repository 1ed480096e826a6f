"""The ground floor of every configuration dataclass: ``ConfigError``, a parameter's meaning and
range written next to its field (``param``), and the checks several configs share.

Every layer may import this module and it imports nothing of the package, so vision/, ingest/
and memory/ configs validate the same way without importing each other. A field declared with
``param`` carries its ``ParamInfo`` in ``dataclasses.Field.metadata``; the node's parameter
descriptors (``ros/params.py``), config/memory.yaml's check and docs/PARAMETERS.md are all read
from it (``videokv_node.settings``), so a parameter's meaning and range are written once.
"""

from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from typing import Any

INT64_MAX = 2**63 - 1
FLOAT_MAX = 1e9  # the top of a non-negative double's range in its ROS descriptor
META_KEY = "videokv.param"


class ConfigError(ValueError):
    """A configuration that cannot work; the message says which field and why."""


@dataclass(frozen=True, slots=True)
class ParamInfo:
    """What a parameter means and which values its ROS descriptor admits (the dataclass checks the rest).

    The descriptor's range is coarse on purpose: an integer is >= 1 (``zero_ok``: >= 0), a double
    is in [0, 1e9] (``fraction``: [0, 1]; ``unbounded``: any); a finer rule (an open end, a sum
    of two fields) is the dataclass's ``__post_init__``, which names the field in its error.
    """

    doc: str  # the description `ros2 param describe` shows, before its writability suffix
    runtime: bool = False  # writable while the node runs (`ros2 param set`); else read-only
    zero_ok: bool = False  # integers: 0 is meaningful ("none", "default", "off")
    fraction: bool = False  # doubles: a share in [0, 1]
    unbounded: bool = False  # doubles: no range (negative values mean something or are clamped where used)
    choices: tuple[str, ...] = ()  # strings: the values it takes (string lists: a subset of them); for the docs, checked by the dataclass

    def int_range(self) -> tuple[int, int]:
        return (0 if self.zero_ok else 1), INT64_MAX

    def float_range(self) -> tuple[float, float] | None:
        if self.unbounded:
            return None
        return 0.0, (1.0 if self.fraction else FLOAT_MAX)

    def range_text(self, default: object) -> str:
        """The range in words for docs/PARAMETERS.md ("" for booleans, free strings and lists)."""
        if self.choices:
            values = ", ".join(f"`{c}`" for c in self.choices)
            return f"subset of {values}" if isinstance(default, (list, tuple)) else values
        if isinstance(default, bool):
            return ""
        if isinstance(default, int):
            return ">= 0" if self.zero_ok else ">= 1"
        if isinstance(default, float):
            bounds = self.float_range()
            return "any" if bounds is None else ("[0, 1]" if self.fraction else ">= 0")
        return ""


def param(default: Any = dataclasses.MISSING, doc: str = "", *, default_factory: Any = dataclasses.MISSING,
          runtime: bool = False, zero_ok: bool = False, fraction: bool = False, unbounded: bool = False,
          choices: tuple[str, ...] = ()) -> Any:
    """A dataclass field that is a node parameter: its default, meaning (``doc``) and range kind."""
    if not doc:
        raise ValueError("a parameter needs a description")
    info = ParamInfo(doc, runtime=runtime, zero_ok=zero_ok, fraction=fraction, unbounded=unbounded, choices=tuple(choices))
    return dataclasses.field(default=default, default_factory=default_factory, metadata={META_KEY: info})


def param_info(f: dataclasses.Field) -> ParamInfo | None:
    """The ``ParamInfo`` of a field declared with ``param``, else None."""
    return f.metadata.get(META_KEY)


def check_fraction(prefix: str, name: str, value: float, low_open: bool = False) -> None:
    """Raise ConfigError unless ``value`` is in [0, 1] (``low_open``: (0, 1])."""
    ok = (0.0 < value <= 1.0) if low_open else (0.0 <= value <= 1.0)
    if not ok:
        raise ConfigError(f"{prefix}.{name} must be in {'(0, 1]' if low_open else '[0, 1]'}, got {value}")


def check_choice(name: str, value: object, choices: tuple) -> None:
    """Raise ConfigError unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ConfigError(f"{name} must be one of {choices}, got {value!r}")

