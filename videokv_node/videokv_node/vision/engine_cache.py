"""A cache of TensorRT engines on disk that a crash, a half-written file or an upgrade cannot poison.

Layout: ``<root>/<slot>/engine.plan`` and ``<root>/<slot>/manifest.json``; a slot is one
model's vision graph at one precision (the caller names it). The manifest records the
``EngineKey`` the engine was built for, the engine's byte count and sha256, and how long
the build took.

Invariants:
- an engine is used only if its manifest parses, its key equals the wanted key field by
  field (ONNX hash, TensorRT version, GPU name, compute capability, precision, profile),
  its file has the recorded size and sha256, and the deserialiser accepts it;
- otherwise it is rebuilt (``rebuild="auto"``) or refused with the reason
  (``rebuild="never"``, ``EngineCacheError``); nothing in here lets an exception of a bad
  file escape as anything but ``EngineCacheError``;
- files are written to a temporary name in the slot, fsynced, then renamed; the engine
  first, the manifest last, so a crash in between leaves a manifest whose hash no longer
  matches (detected, rebuilt), never a manifest vouching for a partial engine.

TensorRT itself is injected (``build`` returns the serialised engine, ``deserialize`` turns
bytes into something runnable, raising or returning None on bad bytes), so all of this is
tested without a GPU.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Generic, TypeVar

from videokv_node.vision.config import REBUILD_MODES

MANIFEST_FORMAT = 1
ENGINE_FILE = "engine.plan"
MANIFEST_FILE = "manifest.json"

T = TypeVar("T")
log = logging.getLogger(__name__)


class EngineCacheError(RuntimeError):
    """No usable engine: missing, stale, corrupt or failed to build; the message says which and what to do."""


@dataclass(frozen=True, slots=True)
class EngineKey:
    """Everything an engine depends on: one field differing means the engine is not this one."""

    onnx_sha256: str  # the exported graph and weights
    tensorrt_version: str  # engines are not portable across TensorRT versions
    gpu_name: str  # nor across GPUs (tactics are timed on this one)
    compute_capability: str  # e.g. "8.7" (Jetson Orin), "9.0" (H100)
    precision: str  # fp16, fp32, int8
    profile: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]  # (min, opt, max) input shapes

    def as_json(self) -> dict:
        d = asdict(self)
        d["profile"] = [list(s) for s in self.profile]
        return d

    @classmethod
    def from_json(cls, d: dict) -> "EngineKey":
        return cls(**{**d, "profile": tuple(tuple(int(x) for x in s) for s in d["profile"])})

    def differences(self, other: "EngineKey") -> list[str]:
        """'field: theirs -> ours' for every field where ``other`` (the cached one) differs."""
        mine, theirs = self.as_json(), other.as_json()
        return [f"{k}: {theirs[k]} -> {mine[k]}" for k in mine if mine[k] != theirs[k]]


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same directory, fsync, rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class EngineCache(Generic[T]):
    """Loads the engine of a slot if it is valid, else builds (or refuses) it; see the module's invariants."""

    def __init__(
        self,
        root: str | Path,
        build: Callable[[], bytes],
        deserialize: Callable[[bytes], T | None],
        rebuild: str = "auto",
        build_hint: str = "",
    ) -> None:
        if rebuild not in REBUILD_MODES:
            raise ValueError(f"rebuild must be one of {REBUILD_MODES}, got {rebuild!r}")
        self.root = Path(root)
        self._build = build
        self._deserialize = deserialize
        self.rebuild = rebuild
        self.build_hint = build_hint  # how long a build may take here, said before one starts
        self.last_event = ""  # what the last load_or_build did: "loaded", or "built (<why>)"

    def paths(self, slot: str) -> tuple[Path, Path]:
        d = self.root / slot
        return d / ENGINE_FILE, d / MANIFEST_FILE

    def check(self, slot: str, key: EngineKey) -> tuple[bytes | None, str]:
        """(engine bytes, "") if the slot holds a valid engine for ``key``, else (None, why not)."""
        engine_path, manifest_path = self.paths(slot)
        if not manifest_path.exists():
            return None, f"no engine cached in {manifest_path.parent}"
        try:
            manifest = json.loads(manifest_path.read_text())
            if manifest.get("format") != MANIFEST_FORMAT:
                return None, f"manifest format {manifest.get('format')!r} is not {MANIFEST_FORMAT}"
            cached = EngineKey.from_json(manifest["key"])
            size, digest = int(manifest["engine_bytes"]), str(manifest["engine_sha256"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            return None, f"manifest {manifest_path} is unreadable ({exc.__class__.__name__}: {exc})"
        diffs = key.differences(cached)
        if diffs:
            return None, "engine was built for another configuration (" + "; ".join(diffs) + ")"
        try:
            data = engine_path.read_bytes()
        except OSError as exc:
            return None, f"engine file {engine_path} is unreadable ({exc})"
        if len(data) != size:
            return None, f"engine file {engine_path} is truncated or damaged ({len(data)} bytes, manifest says {size})"
        if sha256_bytes(data) != digest:
            return None, f"engine file {engine_path} is corrupt (sha256 differs from the manifest's)"
        return data, ""

    def load_or_build(self, slot: str, key: EngineKey) -> T:
        """The deserialised engine of ``slot`` for ``key``; built and stored first if needed and allowed."""
        data, why = self.check(slot, key)
        if data is not None:
            engine = self._try_deserialize(data)
            if engine is not None:
                self.last_event = "loaded"
                return engine
            why = f"TensorRT refused the cached engine in {self.root / slot} (corrupt or from another build)"
        if self.rebuild == "never":
            raise EngineCacheError(f"{why}; vision.engine_rebuild is 'never': build it ahead with "
                                   "`python -m videokv_node.vision.build_engine` or set vision.engine_rebuild auto")
        return self._build_and_store(slot, key, why)

    def _try_deserialize(self, data: bytes) -> T | None:
        try:
            return self._deserialize(data)
        except Exception as exc:  # TensorRT raises various types (or returns None) on bad bytes
            log.warning("deserialising a cached engine failed: %s", exc)
            return None

    def _build_and_store(self, slot: str, key: EngineKey, why: str) -> T:
        engine_path, manifest_path = self.paths(slot)
        previous = self._previous_build_s(manifest_path)
        last = f"; the last build here took {previous:.0f} s" if previous else ""
        log.warning("building a TensorRT engine for %s because %s. This takes a while%s%s; the node waits "
                    "until it is done and the engine is cached for the next start",
                    slot, why, f" ({self.build_hint})" if self.build_hint else "", last)
        t0 = time.monotonic()
        try:
            data = bytes(self._build())
        except EngineCacheError:
            raise
        except Exception as exc:
            raise EngineCacheError(f"building the TensorRT engine for {slot} failed: {exc}") from exc
        seconds = time.monotonic() - t0
        if not data:
            raise EngineCacheError(f"building the TensorRT engine for {slot} produced nothing")
        engine = self._try_deserialize(data)
        if engine is None:
            raise EngineCacheError(f"TensorRT cannot deserialise the engine it just built for {slot}")
        engine_path.parent.mkdir(parents=True, exist_ok=True)
        manifest = {"format": MANIFEST_FORMAT, "key": key.as_json(), "engine_bytes": len(data),
                    "engine_sha256": sha256_bytes(data), "build_seconds": round(seconds, 1)}
        atomic_write(engine_path, data)
        atomic_write(manifest_path, json.dumps(manifest, indent=1).encode())
        log.info("TensorRT engine for %s built in %.0f s and cached in %s", slot, seconds, engine_path)
        self.last_event = f"built ({why})"
        return engine

    @staticmethod
    def _previous_build_s(manifest_path: Path) -> float | None:
        try:
            return float(json.loads(manifest_path.read_text())["build_seconds"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
