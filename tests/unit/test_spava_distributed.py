"""Spava on 2, 3 and 4 gloo processes (CPU, float64) against the single-process oracle.

One spawned 4-process job runs every case on groups of 2, 3 and 4 ranks (a process start costs seconds):
approximate Spava (small anchor and passing lengths, so selection really drops keys),
and the degenerate case passing_len >= block length, which must be exact attention.
"""

from __future__ import annotations

import functools

import torch
import torch.multiprocessing as mp
import pytest

from tests.unit.spava_jobs import free_port, job_inputs, parity_worker, tiny_decoder64
from videokv_node.spava.attention import use_spava_attention
from videokv_node.spava.config import SpavaConfig
from videokv_node.spava.runner import OracleRunner

DECODE_STEPS = 2
APPROX = dict(anchor_len=5, passing_len=3, pool_window=3, total=61, question_len=4)
EXACT = dict(anchor_len=5, passing_len=1000, pool_window=3, total=47, question_len=3)
# Blocks 2r, 2r+1 per rank, collectives waited for at once, question and decoding on rank 1: same numbers.
PLAIN = dict(APPROX, zigzag=False, overlap=False, question_rank=1)
CASES = [APPROX, EXACT, PLAIN]


@functools.cache
def _oracle(world: int, case: int):
    """Oracle layers, logits, and the (decoder, lm_head) it ran on, computed once per world and case."""
    job = CASES[case]
    job = dict(job)
    total, question_len = job.pop("total"), job.pop("question_len")
    decoder, lm_head = tiny_decoder64()
    runner = OracleRunner(decoder, lm_head, SpavaConfig(**job), world)
    layers: list[torch.Tensor] = []
    hooks = [layer.self_attn.o_proj.register_forward_pre_hook(lambda m, args: layers.append(args[0][0].clone()))
             for layer in decoder.layers]
    logits = [runner.prefill(job_inputs(total), question_len)]
    for h in hooks:
        h.remove()
    for step in range(DECODE_STEPS):
        logits.append(runner.decode(job_inputs(1, seed=100 + step)))
    return layers, logits, decoder, lm_head


MAX_WORLD = 4


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """One 4-process job; worlds 2, 3 and 4 run on process groups of its first ranks."""
    out = tmp_path_factory.mktemp("spava")
    mp.spawn(parity_worker, args=(MAX_WORLD, free_port(), str(out), CASES, DECODE_STEPS), nprocs=MAX_WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt") for r in range(MAX_WORLD)]


@pytest.fixture(params=[2, 3, 4])
def job(request, jobs):
    world = request.param
    return world, [jobs[r][world] for r in range(world)]


@pytest.mark.parametrize("case", [0, 1, 2], ids=["approximate", "exact", "no-zigzag-no-overlap"])
def test_every_layer_and_logit_equals_the_oracle(job, case):
    world, ranks = job
    layers, logits, _, _ = _oracle(world, case)
    for rank, results in enumerate(ranks):
        got = results[case]
        pos = got["positions"]
        for layer, (mine, ref) in enumerate(zip(got["layers"], layers)):
            torch.testing.assert_close(mine, ref[pos], rtol=0, atol=1e-12, msg=lambda m: f"rank {rank} layer {layer}: {m}")
        for step, (mine, ref) in enumerate(zip(got["logits"], logits)):
            torch.testing.assert_close(mine, ref, rtol=0, atol=1e-12, msg=lambda m: f"rank {rank} step {step}: {m}")


def test_approximation_differs_from_full_attention(job):
    """Guard: the approximate case really drops keys (else the parity test above proves little)."""
    world, _ = job
    layers, _, decoder, _ = _oracle(world, 0)
    plain_layers, _ = _plain_forward(decoder, APPROX["total"])
    assert (plain_layers[-1] - layers[-1]).abs().max() > 1e-3


def test_passing_everything_equals_a_plain_transformers_forward(job):
    world, ranks = job
    _, logits, decoder, lm_head = _oracle(world, 1)
    plain_layers, hidden = _plain_forward(decoder, EXACT["total"])
    with torch.inference_mode():
        torch.testing.assert_close(lm_head(hidden[:, -1]).float()[0], logits[0], rtol=0, atol=1e-10)
    for rank, results in enumerate(ranks):
        pos = results[1]["positions"]
        for layer, (mine, ref) in enumerate(zip(results[1]["layers"], plain_layers)):
            torch.testing.assert_close(mine, ref[pos], rtol=0, atol=1e-10, msg=lambda m: f"rank {rank} layer {layer}: {m}")


def _plain_forward(decoder, total: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per-layer attention outputs and last hidden state of a plain (sdpa, causal) transformers forward."""
    decoder.config._attn_implementation = "sdpa"  # eager runs its softmax in float32
    layers: list[torch.Tensor] = []
    hooks = [layer.self_attn.o_proj.register_forward_pre_hook(lambda m, args: layers.append(args[0][0].clone()))
             for layer in decoder.layers]
    try:
        with torch.inference_mode():
            hidden = decoder(inputs_embeds=job_inputs(total), position_ids=torch.arange(total)[None]).last_hidden_state
    finally:
        for h in hooks:
            h.remove()
        use_spava_attention(decoder.config)
    return layers, hidden
