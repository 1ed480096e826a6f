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

# Rank 1 of incarnation 1 starts LATE_S after rank 0, long enough for rank 0 to be
# waiting on its peer's key; the join timeout leaves ample slack beyond that on a
# loaded 2-core CI machine (a 5 s timeout against a 4 s delay timed out there once).
# A regression (rank 0 dialling the dead incarnation's address) still fails: rank 0
# never meets rank 1 and the join times out.
LATE_S = 3.0
JOIN_TIMEOUT_S = 30.0


def main() -> int:
    rank, incarnation = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if incarnation == 1 and rank == 1:
        time.sleep(LATE_S)
    control = init_job_groups("gloo", timeout_s=JOIN_TIMEOUT_S)
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
