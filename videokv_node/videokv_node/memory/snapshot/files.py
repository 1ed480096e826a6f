"""The file side of memory snapshots: names, atomic directory swaps, checksums, hard links.

Nothing here knows what a memory is; ``format.py`` (the format) and ``series.py``
(periodic snapshots) build on it. Every function either completes or leaves what was on disk
as it was, apart from temporary directories that the next successful save of the same name
removes (``leftovers``).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import secrets
import shutil
from pathlib import Path

MANIFEST = "manifest.json"
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")  # a plain name: no separator, not hidden, not . or ..


class SnapshotError(ValueError):
    """A snapshot that cannot be written, found or used; the message says which and why (returned verbatim)."""


# --- paths --------------------------------------------------------------------------
def resolve_snapshot_path(root: str | Path, name: str = "", path: str = "") -> Path:
    """The snapshot directory a request names, strictly inside ``root`` once symlinks are resolved.

    Exactly one of ``name`` (a plain name: letters, digits, ``._-``, not starting with ``.``)
    and ``path`` (relative to ``root``, or absolute) must be given. Nothing is created. The check
    holds for the file system as it is now: whoever can write links inside ``root`` is trusted.
    """
    if not str(root).strip():
        raise SnapshotError("snapshots are disabled: memory.snapshot_dir is empty")
    if bool(name) == bool(path):
        raise SnapshotError("give exactly one of a snapshot name or path")
    if name and not _NAME.fullmatch(name):
        raise SnapshotError(f"snapshot name {name!r} is not a plain name (letters, digits, '.', '_' and '-', not starting with '.')")
    try:
        base = Path(root).expanduser().resolve()
        p = Path(name or path).expanduser()
        resolved = (p if p.is_absolute() else base / p).resolve()
    except (ValueError, OSError, RuntimeError) as exc:  # a NUL byte, a symlink loop, a name too long
        raise SnapshotError(f"snapshot path {name or path!r} cannot be resolved: {exc}") from exc
    if base not in resolved.parents:
        raise SnapshotError(f"snapshot path {name or path!r} resolves to {resolved}, not inside memory.snapshot_dir {base}")
    return resolved


# --- atomic directories -------------------------------------------------------------
def new_temporary(target: Path) -> Path:
    """An empty sibling directory ``.<name>.tmp-<hex>`` to build ``target`` in."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{secrets.token_hex(4)}"
    tmp.mkdir()
    return tmp


def swap_in(tmp: Path, target: Path) -> None:
    """Rename the complete ``tmp`` to ``target``, replacing a previous snapshot.

    Renaming a directory over a non-empty one is impossible, so an existing snapshot is first
    renamed aside to ``.<name>.old-<hex>``, the new one renamed in, the parent fsynced and the
    old one deleted. Between the two renames ``target`` is missing and both complete copies
    are there under their temporary names (``leftovers``).
    """
    parent = target.parent
    if not target.exists():
        os.rename(tmp, target)
        fsync(parent)
        return
    aside = parent / f".{target.name}.old-{secrets.token_hex(4)}"
    os.rename(target, aside)
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(aside, target)
        raise
    fsync(parent)
    shutil.rmtree(aside, ignore_errors=True)


def leftovers(target: Path) -> list[Path]:
    """Temporary and set-aside directories of earlier saves of ``target`` that did not finish."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.(tmp|old)-[0-9a-f]{{8}}")
    return sorted(p for p in target.parent.iterdir() if pattern.fullmatch(p.name) and p.is_dir() and not p.is_symlink())


def share_file(src: Path, dst: Path) -> bool:
    """Make ``dst`` hold ``src``'s bytes without copying them where the file system allows.

    A hard link shares the bytes: deleting either name never touches the other, so an older
    snapshot can be deleted without breaking a newer one. Where links are refused (a file
    system without them, EPERM/EXDEV/EMLINK), the file is copied and False returned. A
    missing ``src`` raises FileNotFoundError.
    """
    try:
        os.link(src, dst)
        return True
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise
    shutil.copy2(src, dst)
    fsync(dst)
    return False


def fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def disk_bytes(directory: Path) -> int:
    """Bytes of the files directly in ``directory`` (shared files counted in full)."""
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())
