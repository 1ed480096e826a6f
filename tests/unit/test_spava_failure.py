"""A rank that dies or hangs mid-job: the others fail within the deadline with an error that says so."""

from __future__ import annotations

import time

import pytest
import torch.multiprocessing as mp

from tests.unit.spava_jobs import failing_worker, free_port

TIMEOUT_S = 3.0


@pytest.mark.parametrize("failure", ["die", "hang"])
def test_a_lost_rank_fails_the_job_within_the_timeout(failure, tmp_path):
    world = 2
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=failing_worker, args=(r, world, port, str(tmp_path), failure, TIMEOUT_S)) for r in range(world)]
    start = time.monotonic()
    for p in procs:
        p.start()
    try:
        procs[0].join(timeout=60)
        assert not procs[0].is_alive(), "rank 0 still waits for the lost rank"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
    elapsed_s, message = (tmp_path / "rank0.txt").read_text().split("\n", 1)
    assert message.startswith("SpavaCollectiveError"), message
    assert "layer 0" in message and "rank 0 of 2" in message
    assert float(elapsed_s) < TIMEOUT_S + 2.0
    assert time.monotonic() - start < 60
