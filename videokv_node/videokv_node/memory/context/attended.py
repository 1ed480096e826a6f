"""What a question attended to, per layer: the frames, and how much of each frame.

Read at question time, before the blocks can change: a later compression may drop tokens, an
evicted block leaves the store, and a question-only block (an open segment) never enters it.

A frame counts as attended in a layer when any of its tokens is in that layer's context; its
**share** is the part of the tokens it was encoded with that the layer kept. Frame-level
policies (``full``, ReKV, StreamKV's retrieval) keep whole frames, share 1.0; token-level ones
keep parts of frames: HERMES compresses each layer token by token, MuKV keeps a share of a
retrieved block's tokens. Evaluation uses both (``eval/recall.py``): a needle frame of which a
layer kept one token of 24 is "attended" by frame, and 1/24 by token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from videokv_node.memory.question import Evidence
from videokv_node.memory.store.block import FrameBlock


def attended_frames(layer_blocks: Sequence[Sequence[int]], chosen: Mapping[int, FrameBlock]) -> list[dict[int, float]]:
    """Per layer, {frame stamp: share of that frame's tokens the layer attended to} over the blocks
    ``layer_blocks[layer]`` (ids into ``chosen``). A block that stands for several frames (a MuKV or
    StreamKV segment) gives each of them the block's share: its kept tokens are not attributed to
    the frames within it. A frame cited by two blocks gets the larger share. The summary
    token of the distant past (stamp 0, kind "summary") cites no frame."""
    out = []
    for layer, ids in enumerate(layer_blocks):
        shares: dict[int, float] = {}
        for block in (chosen[i] for i in ids):
            share = block.layer_tokens(layer) / block.n_tokens
            for stamp in block.cited_stamps:
                shares[stamp] = max(shares.get(stamp, 0.0), share)
        out.append(shares)
    return out


def evidence_of(chosen: Mapping[int, FrameBlock]) -> list[Evidence]:
    """The frames an answer attended to, oldest first (a summary token with no stamp cites none),
    each with the robot's pose when it was taken where the frame came with one, and the end of the
    still span it stands for where frames were merged into it (``Evidence.last_stamp_ns``)."""
    cited: dict[tuple[int, str], Evidence] = {}
    for b in chosen.values():
        for s in b.cited_stamps:
            ev = cited.setdefault((s, b.camera), Evidence(s, b.camera))
            ev.pose = ev.pose if ev.pose is not None else b.pose_at(s)
            if b.last_stamp(s) > ev.last:  # a still span (memory/frames/still.py): its end and the pose there
                ev.last_stamp_ns, ev.last_pose = b.last_stamp(s), b.span_end_pose
    return [cited[k] for k in sorted(cited)]
