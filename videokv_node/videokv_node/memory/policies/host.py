"""What a memory policy may ask of the engine it is plugged into, and nothing more.

A policy decides; the engine encodes, stores and counts, and only the engine runs the model
(``ModelRunner``, memory/context/model_runner.py). Some decisions need its help: HERMES scores
the cache with its pseudo-queries (through the model over the live cache, or against the
placed keys) and mints an id for its summary token, StreamKV encodes its open segment ahead
of time, policies with guidance prompts read a text's queries, ReKV's re-ranking reads each
frame of a shortlist alone. ``PolicyHost`` names exactly that, so a policy depends on this
protocol, never on the engine class (no import cycle, and no way to reach the rest), and
never calls the model or builds a cache itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from videokv_node.memory.context.encoding import EncodeJob
from videokv_node.memory.context.retrieval_cache import Sink, Targets
from videokv_node.memory.store.block import FrameBlock
from videokv_node.memory.store.block_store import BlockStore

# probe(text) -> (L, n, H_q, D) pre-RoPE queries of ``text`` read right after the prompt sink.
Probe = Callable[[str], torch.Tensor]


class PolicyHost(Protocol):
    """The engine as a policy sees it."""

    @property
    def store(self) -> BlockStore:
        """The blocks held; a policy reads it and asks it to compress, never to add frame blocks."""

    @property
    def sink(self) -> Sink:
        """The prompt sink's K/V (L, H, S, D), fixed for the engine's life."""

    def new_block_id(self) -> int:
        """An id for a block the policy makes itself (HERMES' summary token): ids only increase."""

    def encode_units(self, job: EncodeJob, provisional: bool = False) -> list[FrameBlock]:
        """Blocks of ``job``'s units, encoded after the policy's encoding context, not stored
        (``provisional``: negative ids, none spent)."""

    def probe(self, text: str) -> torch.Tensor:
        """(L, n, H_q, D) pre-RoPE queries of ``text`` read right after the prompt sink."""

    def read_alone(self, blocks: Sequence[FrameBlock], text: str) -> list[float]:
        """Per block, the mean log-probability per token (natural log, <= 0) of ``text``'s subject as the
        answer to ``answer.locate_prompt`` asked over the prompt sink and that block alone (its kept
        tokens, placed by the policy's layout): ``~/locate``'s re-ranking (``ModelRunner.read_alone``).
        Memory is not changed."""

    def pseudo_attention(self, text: str, per_layer: Sequence[Sequence[FrameBlock]], targets: Targets,
                         start_pos: int) -> list[torch.Tensor]:
        """Per layer, (N_l,) the attention ``text``'s tokens pay to each of ``per_layer[l]``'s tokens, run through
        the model over the sink and those blocks placed at ``targets`` (HERMES' live pseudo-queries)."""

    def placed_keys(self, blocks: Sequence[FrameBlock], targets: Sequence[torch.Tensor], layer: int) -> torch.Tensor:
        """(1, H, S + N, D) keys of ``layer``: the sink, then ``blocks`` placed at ``targets`` (no model run)."""


@dataclass(slots=True)
class EngineHost:
    """A ``PolicyHost`` made of the engine's store, sink and its model runner's methods: what the engine
    hands its policy (``MemoryPolicy.setup``), so the policy holds these, not the engine. Only the
    engine changes it (``held_sink`` is dropped on ``close``, after which ``sink`` raises)."""

    store: BlockStore
    held_sink: Sink | None
    new_block_id: Callable[[], int]
    encode_units: Callable[..., list[FrameBlock]]
    probe: Probe
    read_alone: Callable[[Sequence[FrameBlock], str], list[float]]
    pseudo_attention: Callable[..., list[torch.Tensor]]
    placed_keys: Callable[..., torch.Tensor]

    @property
    def sink(self) -> Sink:
        """The prompt sink's K/V; RuntimeError once the engine is closed (a policy must not outlive it)."""
        if self.held_sink is None:
            raise RuntimeError("the prompt sink was released: the engine is closed")
        return self.held_sink
