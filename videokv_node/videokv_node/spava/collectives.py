"""Asynchronous all-gathers with a deadline and an error that says which step of which rank failed.

Only torch.distributed (gloo on CPU, NCCL on GPUs); nothing home-made. A
collective is started with ``start`` and its result read with ``wait``, as late
as the caller can (paper section 4.4); ``wait`` twice, or before ``start``, raises.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist


class SpavaCollectiveError(RuntimeError):
    """A collective of the Spava job failed or timed out: a rank died, hung or disagreed on a shape."""


class PendingGather:
    """One all-gather in flight: ``wait()`` (once) returns the per-rank tensors, in rank order.

    With ``overlap`` False the gather is completed at once (the paper's "-O" ablation):
    same results, no communication hidden behind computation.
    """

    def __init__(self, what: str, tensor: torch.Tensor, group, world: int, rank: int, timeout_s: float, overlap: bool) -> None:
        self._what = f"{what} (rank {rank} of {world})"
        self._timeout = timedelta(seconds=timeout_s)
        self._parts = [torch.empty_like(tensor) for _ in range(world)]
        self._read = False
        try:
            self._work = dist.all_gather(self._parts, tensor.contiguous(), group=group, async_op=True)
        except Exception as exc:  # noqa: BLE001 - any backend failure is the job's failure
            raise SpavaCollectiveError(f"{self._what}: could not start: {exc}") from exc
        if not overlap:
            self._complete()

    def _complete(self) -> None:
        if self._work is None:
            return
        try:
            self._work.wait(self._timeout)
        except Exception as exc:  # noqa: BLE001
            raise SpavaCollectiveError(
                f"{self._what} did not complete within {self._timeout.total_seconds():.0f} s (a rank died or hangs): {exc}"
            ) from exc
        self._work = None

    def wait(self) -> list[torch.Tensor]:
        if self._read:
            raise RuntimeError(f"{self._what}: waited for twice")
        self._read = True
        self._complete()
        return self._parts


def broadcast_tensor(tensor: torch.Tensor, src: int, group, what: str, timeout_s: float) -> torch.Tensor:
    """Broadcast ``tensor`` in place from rank ``src`` of ``group``, with the same deadline and error as the gathers."""
    try:
        work = dist.broadcast(tensor, group=group, group_src=src, async_op=True)
        work.wait(timedelta(seconds=timeout_s))
    except Exception as exc:  # noqa: BLE001
        raise SpavaCollectiveError(f"{what} did not complete within {timeout_s:.0f} s (a rank died or hangs): {exc}") from exc
    return tensor
