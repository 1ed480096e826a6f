"""The long-replay service's ranks: ``torchrun --nproc-per-node N -m videokv_node.programs.long_replay ...``.

The command is ``programs/long_replay.py`` (this module is not one), which hands this
module's ``main`` the host of rank 0: the ROS 2 action (``serve``, a ``spava.job.ServeJobs``),
so this package never imports ROS. Every other rank waits for jobs, which rank 0 sends with ``broadcast_object_list`` on a
control group (gloo, a long timeout: the service may idle for hours) and then
all ranks run in lockstep on the job group (NCCL on GPUs, gloo on CPU, with
``timeout_s`` so a dead or hung rank fails the job quickly).

A failed collective leaves a process group unusable, so after reporting the
failure in the goal's result rank 0 exits non-zero; run under
``torchrun --max-restarts K`` and the whole group, action server included,
comes back for the next job.

Each incarnation of the group (``TORCHELASTIC_RESTART_COUNT``) keys its process
groups in the rendezvous store under its own prefix: torchrun's static rendezvous
keeps one TCPStore for all restarts, so without it a restarted rank can read the
dead incarnation's gloo addresses, and its connect then waits out the group's
timeout (the control group's is days) instead of meeting its new peers.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from videokv_node.models.factory import load_adapter
from videokv_node.process_settings import apply_process_settings
from videokv_node.spava.config import SpavaConfig
from videokv_node.spava.job import ReplayJob, ReplayOutcome, ServeJobs
from videokv_node.spava.worker import JobCancelled, ReplayWorker

CONTROL_TIMEOUT = timedelta(days=7)
EXIT_BROKEN_GROUP = 3


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="torchrun ... -m videokv_node.programs.long_replay",
                                description="The Spava long-replay service (the LongReplay action on rank 0).")
    p.add_argument("--model", default="tiny", help="'tiny' or a local LLaVA-OneVision checkpoint directory (1-D RoPE decoders)")
    p.add_argument("--device", default="auto", help="auto: cuda:LOCAL_RANK if CUDA is available, else cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0, help="seed of the tiny model's random weights")
    p.add_argument("--anchor-len", type=int, default=SpavaConfig.anchor_len)
    p.add_argument("--passing-len", type=int, default=SpavaConfig.passing_len)
    p.add_argument("--pool-window", type=int, default=SpavaConfig.pool_window)
    p.add_argument("--no-zigzag", action="store_true")
    p.add_argument("--no-overlap", action="store_true")
    p.add_argument("--timeout-s", type=float, default=SpavaConfig.timeout_s, help="a collective slower than this fails the job")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-frames", type=int, default=4096, help="larger goals are refused")
    p.add_argument("--action", default="/videokv/long_replay", help="name of the LongReplay action")
    p.add_argument("--torch-threads", type=int, default=0, help="intra-op CPU threads per rank; 0 = torch's default")
    return p.parse_args(argv)


def _device(arg: str) -> str:
    if arg != "auto":
        return arg
    return f"cuda:{os.environ.get('LOCAL_RANK', '0')}" if torch.cuda.is_available() else "cpu"


class Dispatcher:
    """Rank 0's side: send a job to every rank, run rank 0's part, return the outcome."""

    def __init__(self, worker: ReplayWorker, control) -> None:
        self.worker, self.control = worker, control
        self.broken = False  # set when a collective failed: the group is unusable from then on

    def __call__(self, job: ReplayJob, progress, cancelled) -> ReplayOutcome:
        if self.broken:
            return ReplayOutcome(False, "the Spava job group failed earlier; the service is restarting", [])
        try:
            dist.broadcast_object_list([job], src=0, group=self.control)
            return self.worker.run(job, progress, cancelled)
        except JobCancelled:
            return ReplayOutcome(False, "canceled", [])
        except Exception as exc:  # noqa: BLE001 - whatever failed, the other ranks may be mid-job: restart all
            self.broken = True
            return ReplayOutcome(False, f"the Spava job failed: {exc}", [])

    def stop(self) -> bool:
        """Tell the other ranks to exit; False if one is gone (torchrun stopping the group after a rank died)."""
        if self.broken:
            return False
        try:
            dist.broadcast_object_list([None], src=0, group=self.control)
        except Exception as exc:  # noqa: BLE001 - a peer is gone: nothing left to tell, torchrun restarts the group
            print(f"spava rank 0: could not stop the other ranks: {exc}", file=sys.stderr)
            return False
        return True


def init_job_groups(backend: str, timeout_s: float):
    """Join the job group (the default process group) and return the control group, both keyed per incarnation."""
    store, rank, world = next(dist.rendezvous("env://", timeout=timedelta(seconds=timeout_s)))
    incarnation = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(backend, store=dist.PrefixStore(f"spava/incarnation{incarnation}", store), rank=rank,
                            world_size=world, timeout=timedelta(seconds=timeout_s))
    return dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)


def serve_worker(worker: ReplayWorker, control) -> None:
    """Ranks > 0: run every job rank 0 sends until it sends None."""
    while True:
        box = [None]
        dist.broadcast_object_list(box, src=0, group=control)
        if box[0] is None:
            return
        try:
            worker.run(box[0])
        except JobCancelled:
            continue


def main(argv: list[str] | None = None, serve: ServeJobs | None = None) -> int:
    """Run this rank: rank 0 hosts the service with ``serve`` until it returns, the others run jobs; the exit status."""
    if serve is None:
        raise ValueError("rank 0 needs a host for the service: run torchrun ... -m videokv_node.programs.long_replay")
    args = parse_args(argv)
    apply_process_settings(args.torch_threads)
    cfg = SpavaConfig(anchor_len=args.anchor_len, passing_len=args.passing_len, pool_window=args.pool_window,
                      zigzag=not args.no_zigzag, overlap=not args.no_overlap, timeout_s=args.timeout_s)
    device = _device(args.device)
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    backend = "nccl" if device.startswith("cuda") else "gloo"
    control = init_job_groups(backend, cfg.timeout_s)
    rank = dist.get_rank()
    sys.stderr.write(f"spava rank {rank} of {dist.get_world_size()}: job groups up (incarnation "
                     f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}, pid {os.getpid()})\n")  # one write: ranks interleave
    sys.stderr.flush()
    worker = ReplayWorker(load_adapter(args.model, device, args.dtype, args.seed), cfg, None, args.max_new_tokens)
    if rank != 0:
        try:
            serve_worker(worker, control)
        except Exception as exc:  # noqa: BLE001 - rank 0 restarts the group (exit code for torchrun)
            print(f"spava rank {rank}: job group failed: {exc!r}", file=sys.stderr)
            return EXIT_BROKEN_GROUP
        dist.destroy_process_group()
        return 0
    dispatcher = Dispatcher(worker, control)
    serve(dispatcher, world=worker.world, max_frames=args.max_frames, action=args.action)
    if not dispatcher.stop():
        return EXIT_BROKEN_GROUP
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    # Not a command: the service's command is programs/long_replay.py (rank 0 hosts the ROS action, which this
    # package never imports). Said rather than imported, so server.py and the command import each other in no way.
    sys.exit("the Spava long-replay service runs as: torchrun --nproc-per-node N -m videokv_node.programs.long_replay ...")
