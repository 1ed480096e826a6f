"""Several frames prefilled in one decoder pass, each exactly as if it were encoded alone after the ones before it.

Why: per frame, the decoder reads all its weights for a few tokens (6 on videokv-tiny) and
the frame's window is placed (its keys re-rotated) again; four cameras at 0.5 fps needed
more model time than the CPU had (docs/bench/load.md). One pass over n frames reads the
weights and places the window once.

When: the policy says so with ``MemoryPolicy.batch_window`` (ReKV): the encoding context of
a frame is the newest resident blocks (creation order) within that many tokens, each frame
is one job of one unit with no observer and no compression, and the caps never take a
block of the next frame's window (ReKV's budget holds the sink, the window and a frame, and
demotes the oldest first). Every context block must keep all its tokens in every layer;
otherwise ``prefill`` returns None and the engine encodes frame by frame.

How it stays exact. Alone, frame i attends to the sink and ``window_i`` packed after it, and
stands right after them. In the batch one sequence holds the first frame's window packed
after the sink, then frames 0..n-1 in turn. Packing is sequential (``VideoLLMAdapter.pack``:
a piece moves with the cursor), so a suffix of a packed list is that list packed alone,
translated; ``window_i`` is the suffix of [window_0, frames 0..i-1] ending right before frame
i, so frame i's distances to its window and to its own tokens are the alone ones. Only the
sink is ``d_i`` further away (the tokens of the sequence before ``window_i``): the sink is
placed once per distinct ``d_i``, rotated by it (rotations compose exactly, ``models/rope.py``),
and a mask lets frame i's tokens see their sink copy, their window and their own frame
causally. Each frame's keys are then rotated back by ``-d_i``: its block is the one
per-frame ingest makes (positions, keys, values; float rounding apart, tested in float64 by
tests/unit/test_batch_prefill.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from transformers.cache_utils import DynamicCache

from videokv_node.memory.context.encoding import EncodeJob, Unit
from videokv_node.memory.context.retrieval_cache import Sink, Targets, place_layer
from videokv_node.memory.store.block import FrameBlock, LayerKV
from videokv_node.memory.store.block_store import BlockStore
from videokv_node.models.adapter import VideoLLMAdapter
from videokv_node.pose import Pose


def window_starts(context_tokens: Sequence[int], unit_tokens: Sequence[int], window_tokens: int) -> list[int]:
    """Per unit i, where its window starts among the items [context..., units...]: the newest items
    before unit i whose tokens fit in ``window_tokens``, taken newest first up to the first that does
    not fit (``store/block.py``'s ``newest_within``). The context is the first unit's window (item 0 on)."""
    sizes = list(context_tokens) + list(unit_tokens)
    starts = []
    for i in range(len(unit_tokens)):
        lo, total = len(context_tokens) + i, 0
        while lo > 0 and total + sizes[lo - 1] <= window_tokens:
            lo -= 1
            total += sizes[lo]
        starts.append(lo)
    return starts


def whole(block: FrameBlock, n_layers: int) -> bool:
    """True when ``block`` keeps all its tokens in every layer (nothing compressed away)."""
    return all(kv is not None and kv.n_tokens == block.n_tokens for kv in block.layers[:n_layers])


class BatchPrefill:
    """The result of one batched pass: per unit, the encoding positions, keys and values it would
    have had alone, and the window (items of ``context`` + earlier units) it attended to."""

    def __init__(self, units: list[Unit], positions: list[torch.Tensor], keys: list[torch.Tensor],
                 values: list[torch.Tensor], starts: list[int], context: list[FrameBlock]) -> None:
        self.units = units
        self.positions = positions  # per unit (P, t): where it stood alone
        self.keys = keys  # per unit (L, H, t, D), rotated at ``positions``
        self.values = values  # per unit (L, H, t, D)
        self.starts = starts  # per unit, index of its window's first item in context + units
        self.context = context  # the first unit's window, time order

    def check_window(self, i: int, made: Sequence[FrameBlock], context: Sequence[FrameBlock]) -> None:
        """Raise RuntimeError unless ``context`` (the policy's encoding context now, before unit i is
        stored) is the window unit i was prefilled with; ``made``: the blocks of units 0..i-1, stored.
        A guard of ``batch_window``'s contract: a frame never silently attends to another context."""
        planned = (list(self.context) + list(made))[self.starts[i]:]
        if [b.block_id for b in planned] != [b.block_id for b in context]:
            raise RuntimeError(f"batched prefill: frame {i}'s context changed between frames ({len(planned)} blocks "
                               f"planned, {len(context)} now): the policy's batch_window contract is broken")


@torch.inference_mode()
def prefill(adapter: VideoLLMAdapter, store: BlockStore, sink: Sink, context: list[FrameBlock], targets: Targets,
            start: int, units: list[Unit], window_tokens: int) -> BatchPrefill | None:
    """One pass over ``units`` after ``context`` (placed at ``targets``, the next position ``start``,
    as the policy's layout gives them for the first unit); None when a context block is not whole."""
    n_layers = adapter.geometry.n_layers
    if not all(whole(b, n_layers) for b in context):
        return None
    starts = window_starts([b.n_tokens for b in context], [u.feat.shape[0] for u in units], window_tokens)
    unit_at, at = [], start  # where each unit starts in the batch's sequence
    for u in units:
        unit_at.append(at)
        at += u.span
    item_at = [int(t.min()) for t in targets[0]] + unit_at  # the layout is the same in every layer (whole blocks)
    S = sink.n_tokens
    shifts = [item_at[lo] - S for lo in starts]  # d_i: how much further the sink is than alone
    copies = sorted(set(shifts))
    sink_keys = [sink.keys if d == 0 else adapter.rotate_keys(sink.keys, torch.full((S,), d)) for d in copies]  # (L, H, S, D) each
    layers = []
    for layer in range(n_layers):
        keys, values = place_layer(adapter, store, sink, context, targets[layer], layer)  # (1, H, S + C, D)
        keys = torch.cat([k[layer] for k in sink_keys] + [keys[0, :, S:]], dim=1)[None]
        values = torch.cat([sink.values[layer]] * len(copies) + [values[0, :, S:]], dim=1)[None]
        layers.append((keys, values))
    mask = _mask(units, context, starts, [copies.index(d) for d in shifts], len(copies) * S, S)
    positions = [u.offsets + a for u, a in zip(units, unit_at)]
    cache = DynamicCache(ddp_cache_data=layers)
    embeds = torch.cat([u.feat for u in units])[None]  # (1, N, hidden)
    adapter.forward(embeds, torch.cat(positions, dim=1), cache, logits=False, mask=mask[None, None])
    n = embeds.shape[1]
    keys = torch.stack([layer.keys[0, :, -n:] for layer in cache.layers])  # (L, H, N, D)
    values = torch.stack([layer.values[0, :, -n:] for layer in cache.layers])
    out_pos, out_keys, out_values, at = [], [], [], 0
    for u, pos, d in zip(units, positions, shifts):
        t = u.feat.shape[0]
        k = keys[:, :, at:at + t]
        out_keys.append(adapter.rotate_keys(k, torch.full((t,), -d)) if d else k)  # back to where it stood alone
        out_values.append(values[:, :, at:at + t])
        out_pos.append(pos - d)
        at += t
    return BatchPrefill(units, out_pos, out_keys, out_values, starts, list(context))


def _mask(units: list[Unit], context: list[FrameBlock], starts: list[int], copy: list[int], sinks: int, S: int) -> torch.Tensor:
    """(N, K) boolean: unit i's tokens see sink copy ``copy[i]``, their window and their own unit causally.
    Keys: the sink copies (``sinks`` tokens), the context's tokens, the units' tokens, in that order."""
    sizes = [b.n_tokens for b in context] + [u.feat.shape[0] for u in units]
    key_at = [sinks]
    for s in sizes:
        key_at.append(key_at[-1] + s)
    n = sum(u.feat.shape[0] for u in units)
    mask = torch.zeros(n, key_at[-1], dtype=torch.bool)
    row = 0
    for i, u in enumerate(units):
        t = u.feat.shape[0]
        own = key_at[len(context) + i]  # the unit's first key
        rows = slice(row, row + t)
        mask[rows, copy[i] * S:(copy[i] + 1) * S] = True
        mask[rows, key_at[starts[i]]:own] = True
        mask[rows, own:own + t] = torch.ones(t, t, dtype=torch.bool).tril()
        row += t
    return mask


def build_blocks(adapter: VideoLLMAdapter, job: EncodeJob, positions: list[torch.Tensor], keys: torch.Tensor,
                 values: torch.Tensor, ids: list[int], poses: Mapping[tuple[str, int], Pose]) -> list[FrameBlock]:
    """The blocks of ``job``'s units from their encoded (L, H, n, D) ``keys`` and ``values`` (units in
    order, each rotated at its ``positions``), with block ids ``ids`` and the poses of their frames
    (by camera and stamp) found in ``poses``.

    The representative key for retrieval is the mean of the *pre-RoPE* keys, so scores do not depend on position.
    """
    pre_rope = adapter.rotate_keys(keys, -torch.cat(positions, dim=1)).float()  # (L, H, n, D)
    blocks, at = [], 0
    for unit, pos, block_id in zip(job.units, positions, ids):
        t = pos.shape[1]
        sl = slice(at, at + t)
        at += t
        index = torch.arange(t)
        layers: list[LayerKV | None] = [  # FrameBlock.layers: None where a layer's tokens are dropped later
            LayerKV(index=index, logical=pos, keys=keys[l, :, sl].clone(), values=values[l, :, sl].clone())
            for l in range(keys.shape[0])
        ]
        blocks.append(
            FrameBlock(
                block_id=block_id,
                camera=unit.camera,
                stamp_ns=unit.stamp_ns,
                positions=pos,
                key_mean=pre_rope[:, :, sl].mean(dim=2).cpu(),
                layers=layers,
                kind=unit.kind,
                stream=job.stream,
                stamps_ns=unit.stamps_ns,
                rank=unit.rank,
                protected=unit.protected,
                poses=tuple(poses.get((unit.camera, s)) for s in (unit.stamps_ns or (unit.stamp_ns,))),
            )
        )
    return blocks
