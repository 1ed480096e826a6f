"""Low-rank adapters (LoRA, Hu et al. 2021) on a decoder's attention projections, for ``videokv-tiny``.

Why: a projector alone can only move the decoder's *inputs*. Trained that way, the frozen
SmolLM2 learned to read shape, position and count from the visual tokens but not colour
(held-out colour 0.11, below chance), while the same tokens held colour (a probe read it at
97% before the answer loss moved them). A rank-8 update of ``q_proj`` and ``v_proj`` lets the
decoder learn where to look and what to carry, the smallest change LLaVA-style recipes make
to a frozen LLM.

How, without touching the attention code: in training the update is added by forward hooks
on the ``nn.Linear`` modules (public ``register_forward_hook``); for inference it is merged
into their weights (``W + (alpha / rank) * B @ A``), so the adapter, its registered attention
and every memory policy see a plain ``LlamaForCausalLM`` with different numbers.
"""

from __future__ import annotations

import math

import torch
from torch import nn

DEFAULT_TARGETS = ("q_proj", "v_proj")


def _key(layer: int, target: str) -> str:
    return f"layer{layer}_{target}"


class DecoderLoRA(nn.Module):
    """``A`` (rank, in) and ``B`` (out, rank) per targeted projection of every decoder layer.

    Initialised as the paper and peft do: ``A`` Kaiming-uniform, ``B`` zero, so training starts
    from the unchanged decoder.
    """

    def __init__(self, llm, rank: int = 8, alpha: float = 16.0, targets: tuple[str, ...] = DEFAULT_TARGETS):
        super().__init__()
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        self.rank, self.alpha, self.targets = rank, float(alpha), tuple(targets)
        self.scale = self.alpha / rank
        self.A, self.B = nn.ParameterDict(), nn.ParameterDict()
        for i, layer in enumerate(llm.model.layers):
            for t in self.targets:
                linear = getattr(layer.self_attn, t)
                a = torch.empty(rank, linear.in_features, dtype=linear.weight.dtype)
                nn.init.kaiming_uniform_(a, a=math.sqrt(5))
                self.A[_key(i, t)] = nn.Parameter(a)
                self.B[_key(i, t)] = nn.Parameter(torch.zeros(linear.out_features, rank, dtype=linear.weight.dtype))

    def _modules_of(self, llm):
        for i, layer in enumerate(llm.model.layers):
            for t in self.targets:
                yield _key(i, t), getattr(layer.self_attn, t)

    def attach(self, llm) -> list:
        """Add ``scale * x A^T B^T`` to each targeted projection's output; returns the hook handles."""
        handles = []
        for key, linear in self._modules_of(llm):
            def hook(module, args, output, key=key):
                return output + self.scale * (args[0] @ self.A[key].T) @ self.B[key].T
            handles.append(linear.register_forward_hook(hook))
        return handles

    @torch.no_grad()
    def merge_into(self, llm) -> None:
        """``W += scale * B @ A`` in place: the decoder then computes what the hooked one did."""
        for key, linear in self._modules_of(llm):
            delta = self.scale * (self.B[key] @ self.A[key])
            linear.weight += delta.to(linear.weight.dtype)

    def config(self) -> dict:
        """What the manifest records and ``from_config`` needs to rebuild the modules before loading."""
        return {"rank": self.rank, "alpha": self.alpha, "targets": list(self.targets)}

    def widened(self, llm, targets: tuple[str, ...]) -> "DecoderLoRA":
        """An adapter on ``targets`` besides this one's (same rank and alpha) carrying this one's ``A`` and ``B``;
        the new projections start as ``__init__`` starts them (``B`` zero), so it computes what this one does.
        Why: videokv-tiny v6-run6 (issue 43) adds ``k_proj`` and ``o_proj`` to a trained q/v adapter."""
        wide = DecoderLoRA(llm, self.rank, self.alpha, tuple(dict.fromkeys(self.targets + tuple(targets))))
        with torch.no_grad():
            for key in self.A:
                wide.A[key].copy_(self.A[key])
                wide.B[key].copy_(self.B[key])
        return wide

    def load_narrower(self, state: dict[str, torch.Tensor]) -> None:
        """Load an adapter saved on some of this one's targets (a run before ``widened``): every projection it has
        is loaded, every other target keeps its zero update; a key this adapter lacks, or a target the saved one
        covers only in part, is an error."""
        saved = set(state)  # 'A.layer0_q_proj'
        targets = {k.split("_", 1)[1] for k in saved}
        expected = {f"{part}.{k}" for part in "AB" for k in self.A if k.split("_", 1)[1] in targets}
        if saved != expected:
            raise ValueError(f"the saved LoRA does not fit: {sorted(saved ^ expected)[:4]} ...")
        self.load_state_dict({**self.state_dict(), **state}, strict=True)

    @classmethod
    def from_config(cls, llm, config: dict) -> "DecoderLoRA":
        return cls(llm, rank=int(config["rank"]), alpha=float(config["alpha"]), targets=tuple(config["targets"]))
