"""A torchrun job that joins the Spava service's process groups twice (``python -m torch.distributed.run ... -m tests.unit.spava_restart_job``).

Incarnation 0: both ranks join, then rank 1 dies. Incarnation 1 (torchrun's
restart): rank 1 comes up late, so rank 0 looks up its peer in the rendezvous
store before the new rank 1 has written its address; with the dead incarnation's
keys still there, rank 0 would connect to a port nobody listens on any more.
Both ranks then run a collective on each group and print ``incarnation 1 rank R ok``.
"""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

from videokv_node.spava.server import init_job_groups


def main() -> int:
    rank, incarnation = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if incarnation == 1 and rank == 1:
        time.sleep(4.0)
    control = init_job_groups("gloo", timeout_s=5.0)
    if incarnation == 0:
        if rank == 1:
            os._exit(1)  # a rank dies: torchrun stops rank 0 and restarts both
        time.sleep(120)
        return 1
    box = [rank]
    dist.broadcast_object_list(box, src=0, group=control)
    total = torch.tensor([rank + 1])
    dist.all_reduce(total)
    assert box == [0] and int(total) == 3, (box, total)
    print(f"incarnation {incarnation} rank {rank} ok", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
