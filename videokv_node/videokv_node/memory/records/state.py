"""What every part that gives and takes state shares with the snapshot format.

Blocks, the block store, the policies and the engine each give ``state_dict()`` and take
``load_state_dict()`` (the torch convention: JSON-able values and tensors, tensors by
reference, never copied on the way out); ``snapshot/format.py`` writes such a state to disk and reads
it back. Both sides import this module and nothing else of each other.
"""

from __future__ import annotations

import torch


class PolicyStateError(ValueError):
    """A policy's saved state that does not fit this policy's config (raised by the engine's
    ``load_state_dict``, nothing changed); other errors of a state mean it is malformed."""


def dtype_name(dtype: torch.dtype) -> str:
    """A dtype as JSON holds it: ``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    """The dtype ``dtype_name`` gave; ValueError for any other string."""
    dtype = getattr(torch, str(name), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


def host_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy on the host that shares no memory with ``t`` (safetensors refuses shared
    tensors, and a view would save its whole base)."""
    return t.detach().to(torch.device("cpu"), memory_format=torch.contiguous_format, copy=True)


def reason(exc: BaseException) -> str:
    """An exception as a refusal's reason (a KeyError's message is only the key)."""
    return f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
