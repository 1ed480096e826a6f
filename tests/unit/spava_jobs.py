"""Worker functions of the Spava multi-process tests (spawned; a module of its own so children import it cheaply).

Every worker builds the same seeded tiny LLaVA-OneVision decoder in float64, joins a
gloo group on a free loopback port and writes what it computed to ``out_dir/rank{r}.pt``;
the test process compares with the single-process oracle.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_decoder64(seed: int = 0):
    """(decoder, lm_head, embed_tokens) of the tiny LLaVA-OneVision in float64, decoder under ``spava``."""
    from videokv_node.models.llava_onevision import tiny_config
    from videokv_node.models.tiny_tokenizer import build_tiny_tokenizer
    from transformers import LlavaOnevisionForConditionalGeneration

    from videokv_node.spava.attention import use_spava_attention

    cfg = tiny_config(build_tiny_tokenizer())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaOnevisionForConditionalGeneration(cfg).double().eval()
    use_spava_attention(model.config.text_config)
    return model.model.language_model, model.lm_head


def job_inputs(total: int, hidden: int = 64, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, total, hidden, generator=g, dtype=torch.float64)


def _init(rank: int, world: int, port: int, timeout_s: float) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))


def parity_worker(rank: int, world: int, port: int, out_dir: str, jobs: list[dict], decode_steps: int) -> None:
    """For every sub-world W = 2..world (the first W ranks, a process group of their own: starting one
    job per W would cost seconds per process) run each job (a SpavaConfig's kwargs plus total and
    question_len) and record each layer's attention output of the local tokens and the logits."""
    from videokv_node.spava.config import SpavaConfig
    from videokv_node.spava.runner import ShardRunner

    _init(rank, world, port, 60.0)
    decoder, lm_head = tiny_decoder64()
    results: dict[int, list[dict]] = {}
    for sub_world in range(2, world + 1):
        group = dist.new_group(list(range(sub_world)))  # collective: every rank calls it
        if rank >= sub_world:
            continue
        results[sub_world] = []
        for job in jobs:
            job = dict(job)
            total, question_len = job.pop("total"), job.pop("question_len")
            runner = ShardRunner(decoder, lm_head, SpavaConfig(**job), group)
            layers: list[torch.Tensor] = []
            hooks = [layer.self_attn.o_proj.register_forward_pre_hook(lambda m, args: layers.append(args[0][0].clone()))
                     for layer in decoder.layers]
            logits = [runner.prefill(job_inputs(total), question_len)]
            for h in hooks:
                h.remove()
            for step in range(decode_steps):
                logits.append(runner.decode(job_inputs(1, seed=100 + step)))
            results[sub_world].append({"positions": runner.layout.local_positions(rank), "layers": layers, "logits": logits})
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def failing_worker(rank: int, world: int, port: int, out_dir: str, failure: str, timeout_s: float) -> None:
    """Rank world-1 dies (``failure='die'``) or hangs (``'hang'``) before layer 0's attention; the others
    record their error. No model: one layer's attention call is where a job waits for its peers."""
    from videokv_node.spava.config import SpavaConfig
    from videokv_node.spava.layout import Layout
    from videokv_node.spava.shard import ShardPrefill

    _init(rank, world, port, timeout_s)
    cfg = SpavaConfig(anchor_len=4, passing_len=2, pool_window=3, timeout_s=timeout_s)
    lay = Layout.build(cfg, total=30, question_len=4, world=world)
    n = len(lay.local_positions(rank))
    q, k, v = torch.randn(4, n, 8), torch.randn(2, n, 8), torch.randn(2, n, 8)
    dist.barrier()
    if rank == world - 1:
        if failure == "die":
            os._exit(3)
        time.sleep(timeout_s * 4)
        os._exit(0)
    start = time.monotonic()
    try:
        ShardPrefill(lay, cfg, None, rank)(0, q, k, v, 0.35)
        message = "no error"
    except Exception as exc:  # noqa: BLE001 - the test inspects the type and message
        message = f"{type(exc).__name__}: {exc}"
    with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
        f.write(f"{time.monotonic() - start:.3f}\n{message}")
    os._exit(0)  # the group is broken: skip destroy, which would wait for the missing peer
