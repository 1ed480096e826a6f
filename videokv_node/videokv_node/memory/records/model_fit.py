"""``fit_to_model``: the memory's defaults that cannot hold for the loaded model, adapted, each adaptation said.

Kept apart from ``memory/config.py`` (the parameters) because it needs the model's frame size, known only
once the adapter is loaded; the engine calls it at start and on every run-time reconfiguration.
"""

from __future__ import annotations

import dataclasses

from videokv_node.memory.config import DEFAULT_WINDOW_FRAMES, DEFAULT_WINDOW_TOKENS, ConfigError, MemoryConfig, MuKVConfig


def fit_to_model(memory: MemoryConfig, tokens_per_frame: int) -> tuple[MemoryConfig, list[str]]:
    """``memory`` with the defaults that cannot hold for a model of ``tokens_per_frame`` adapted,
    and a sentence per adaptation (the node logs them); a value set away from its default that cannot
    hold raises ConfigError naming the values that would.

    Two cases. The local window's default is ``DEFAULT_WINDOW_FRAMES`` frames of videokv-tiny (12 tokens:
    96, chosen on the hour, docs/bench/hour.md); a model whose frames are larger (LLaVA-OneVision's 196:
    not one frame would fit) gets that many of its own frames. A value set equal to the default is
    taken for the default (a dataclass cannot tell them apart; the log says what it became).
    MuKV's patch blocks split a frame's tokens in ``patch_split`` equal runs. The
    paper's 4 fits LLaVA-OneVision's 196 tokens; videokv-tiny has 6, so the default becomes the
    largest divisor of the frame's tokens not above it (3: patch blocks of 2 tokens).
    """
    notes = []
    if memory.local_window_tokens == DEFAULT_WINDOW_TOKENS and DEFAULT_WINDOW_TOKENS < DEFAULT_WINDOW_FRAMES * tokens_per_frame:
        window = DEFAULT_WINDOW_FRAMES * tokens_per_frame
        memory = dataclasses.replace(memory, local_window_tokens=window)
        notes.append(f"memory.local_window_tokens: the default {DEFAULT_WINDOW_TOKENS} is {DEFAULT_WINDOW_FRAMES} frames of "
                     f"videokv-tiny; this model's frames are {tokens_per_frame} tokens: using {window} "
                     f"({DEFAULT_WINDOW_FRAMES} frames)")
    memory, mukv_notes = _fit_mukv(memory, tokens_per_frame)
    return memory, notes + mukv_notes


def _fit_mukv(memory: MemoryConfig, tokens_per_frame: int) -> tuple[MemoryConfig, list[str]]:
    mukv = memory.mukv
    if memory.policy != "mukv" or "patch" not in mukv.granularities or tokens_per_frame % mukv.patch_split == 0:
        return memory, []
    default = MuKVConfig().patch_split
    divisors = [d for d in range(1, tokens_per_frame + 1) if tokens_per_frame % d == 0]
    if mukv.patch_split != default:
        raise ConfigError(f"memory.mukv.patch_split ({mukv.patch_split}) must divide the {tokens_per_frame} tokens of a frame "
                          f"of this model: one of {divisors}")
    split = max(d for d in divisors if d <= default)
    fitted = dataclasses.replace(memory, mukv=dataclasses.replace(mukv, patch_split=split))
    return fitted, [f"memory.mukv.patch_split: the default {default} does not divide the {tokens_per_frame} tokens of a frame "
                    f"of this model; using {split} (patch blocks of {tokens_per_frame // split} tokens)"]
