"""A memory block: the KV entries of one frame (or one segment, patch or summary), the unit the memory keeps or drops.

Compression works inside a block: a policy may keep only some of its tokens,
and a different subset in each decoder layer (StreamKV drops whole frame
blocks per layer, MuKV keeps a share of each block's tokens, HERMES evicts
tokens per layer). So a block holds, per layer, the indices of the tokens it
still has and their K/V; a layer with none left holds ``None``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum

import torch

from videokv_node.pose import Pose


class Tier(Enum):
    RESIDENT = "resident"  # K/V tensors on the model's device
    OFFLOADED = "offloaded"  # K/V in pages of the host arena


@dataclass(eq=False, slots=True)
class LayerKV:
    """One layer's kept tokens of a block.

    ``index`` picks the kept tokens among the block's encoded tokens (ascending,
    so time order survives compression); ``logical`` is where they stand now for
    RoPE (HERMES re-indexing moves it; the stored keys never move: placement
    rotates a copy from the encoding position, so rounding never accumulates).
    """

    index: torch.Tensor  # (t,) int64 on the host, ascending
    logical: torch.Tensor  # (P, t) int64 on the host
    keys: torch.Tensor | None = None  # (H, t, D) rotated at the encoding positions, when resident
    values: torch.Tensor | None = None  # (H, t, D) when resident
    pages: list[int] = field(default_factory=list)  # host arena pages when offloaded

    @property
    def n_tokens(self) -> int:
        return int(self.index.numel())

    def resident_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) of a resident block's layer; ValueError where they are not held here (offloaded: in pages)."""
        if self.keys is None or self.values is None:
            raise ValueError("this layer's K/V are not resident (offloaded or released)")
        return self.keys, self.values


@dataclass(eq=False, slots=True)
class FrameBlock:
    """One unit of memory over all layers, with what is needed to move, score and cite it.

    ``positions`` are the positions the keys were encoded at (never changed).
    ``key_mean`` is the mean pre-RoPE key per layer and head over the encoded
    tokens, the block's representative for ReKV/StreamKV retrieval; ``rep`` is a
    policy's own representative (MuKV's compressed last-layer key). ``order``
    sorts blocks in time order for placement (stamp first, then the policy's
    rank among blocks of the same stamp, then the id).
    """

    block_id: int  # strictly increasing in creation order; set by the engine
    camera: str  # topic name of the camera
    stamp_ns: int  # header stamp of the (first) frame it holds
    positions: torch.Tensor  # (P, T) int64 on the host
    key_mean: torch.Tensor  # (L, H_kv, D) float32 on the host
    layers: list[LayerKV | None]  # per decoder layer; changed only by BlockStore
    kind: str = "frame"  # frame | summary | patch | segment: what the tokens encode
    stream: str = "frame"  # which encoding stream it belongs to (MuKV keeps one per granularity)
    stamps_ns: tuple[int, ...] = ()  # every frame it represents (evidence); default (stamp_ns,)
    rank: int = 0  # order among blocks of the same stamp
    protected: bool = False  # never compressed (StreamKV summary frames, HERMES summary tokens)
    rep: torch.Tensor | None = None  # policy-specific representative vector
    tier: Tier = Tier.RESIDENT  # changed only by BlockStore
    # Bumped by BlockStore whenever a layer's K/V change in place (HERMES' running summary token);
    # compression only ever keeps a subset, so a snapshot may reuse the K/V it stored at the same revision.
    revision: int = 0
    poses: tuple[Pose | None, ...] = ()  # robot pose at each of stamps_ns (same order), None where unknown; set by the engine
    # A still span (memory/frames/still.py, issue 36): later frames of its camera that showed what its newest
    # stamp showed, merged into it. Set by BlockStore.extend_span only; 0 / 0 / None: none merged.
    span_end_ns: int = 0  # the last merged frame's stamp
    frames_merged: int = 0  # frames merged into it
    span_end_pose: Pose | None = None  # the robot's pose at span_end_ns, if known
    # The words the model's frame tokens spell out (``VideoLLMAdapter.frame_words``: videokv-tiny v5's nouns), of
    # every frame it stands for, each once, in stamp order and each frame's own order; set when stored. ~/locate's
    # shortlist reads them (memory/questions/locate.py ``words_shortlist``).
    words: tuple[str, ...] = ()

    def pose_at(self, stamp_ns: int) -> Pose | None:
        """The robot's pose when the frame stamped ``stamp_ns`` (one of ``stamps_ns``) was taken, if known."""
        for s, pose in zip(self.stamps_ns, self.poses):
            if s == stamp_ns:
                return pose
        return None

    def last_stamp(self, stamp_ns: int) -> int:
        """The last frame ``stamp_ns`` (one of ``stamps_ns``) stands for: its span's end where frames were
        merged into it (only the newest stamp has a span), else itself."""
        return self.span_end_ns if self.span_end_ns and stamp_ns == max(self.stamps_ns) else stamp_ns

    def __post_init__(self) -> None:
        if not self.stamps_ns:
            self.stamps_ns = (self.stamp_ns,)

    @property
    def n_tokens(self) -> int:
        """Tokens it was encoded with (what it occupies in an encoding window)."""
        return int(self.positions.shape[1])

    @property
    def cited_stamps(self) -> tuple[int, ...]:
        """The frames it stands for as evidence: ``stamps_ns``, none for a summary token with no stamp
        (HERMES' fold of the distant past)."""
        return self.stamps_ns if self.stamp_ns > 0 or self.kind != "summary" else ()

    @property
    def order(self) -> tuple[int, int, int]:
        return (self.stamp_ns, self.rank, self.block_id)

    def kept(self, layer: int) -> LayerKV:
        """``layers[layer]`` where the caller holds the block present in that layer (``present_in``, a plan);
        ValueError where it keeps nothing there (a plan out of step with the store)."""
        kv = self.layers[layer]
        if kv is None:
            raise ValueError(f"block {self.block_id} keeps no tokens in layer {layer}")
        return kv

    def layer_tokens(self, layer: int) -> int:
        kv = self.layers[layer]
        return 0 if kv is None else kv.n_tokens

    @property
    def entries(self) -> int:
        """Kept (token, layer) entries: what the block costs, in units of one token in one layer."""
        return sum(kv.n_tokens for kv in self.layers if kv is not None)

    @property
    def is_empty(self) -> bool:
        return all(kv is None for kv in self.layers)

    # --- state --------------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything the block is but its K/V, tensors by reference (copy before changing them).

        K/V are left out: an offloaded block's live in the host arena, so the store adds them
        (``BlockStore.state_dict``). ``layers`` holds, per layer, None or the kept token
        ``index`` (t,) and their ``logical`` positions (P, t).
        """
        return {
            "id": self.block_id, "camera": self.camera, "stamp_ns": self.stamp_ns, "stamps_ns": list(self.stamps_ns),
            "kind": self.kind, "stream": self.stream, "rank": self.rank, "protected": self.protected,
            "tier": self.tier.value, "revision": self.revision, "poses": list(self.poses),
            "span_end_ns": self.span_end_ns, "frames_merged": self.frames_merged, "span_end_pose": self.span_end_pose,
            "words": list(self.words),
            "positions": self.positions, "key_mean": self.key_mean, "rep": self.rep,
            "layers": [None if kv is None else {"index": kv.index, "logical": kv.logical} for kv in self.layers],
        }

    @classmethod
    def from_state_dict(cls, state: dict, device: torch.device | None = None) -> FrameBlock:
        """The block a ``state_dict`` describes, each layer with its ``keys`` and ``values`` (H, t, D).

        A resident block's K/V are copied onto ``device`` (default: where they are); an offloaded
        block's stay as given, staged for ``BlockStore.load_state_dict`` to page in. Raises
        ValueError for a state no block can have: kept token indices not ascending within the
        block's tokens, or nothing kept in any layer.
        """
        block_id, tier = int(state["id"]), Tier(state["tier"])
        n_tokens = int(state["positions"].shape[1])
        layers: list[LayerKV | None] = []
        for layer, kv in enumerate(state["layers"]):
            if kv is None:
                layers.append(None)
                continue
            idx, keys, values = kv["index"], kv["keys"], kv["values"]
            if idx.numel() < 1 or int(idx.min()) < 0 or int(idx.max()) >= n_tokens or not bool((idx[1:] > idx[:-1]).all()):
                raise ValueError(f"block {block_id} layer {layer}: kept token indices must ascend within its {n_tokens} tokens")
            if tier is Tier.RESIDENT and device is not None:
                keys = keys.to(device, memory_format=torch.contiguous_format, copy=True)
                values = values.to(device, memory_format=torch.contiguous_format, copy=True)
            layers.append(LayerKV(idx, kv["logical"], keys, values))
        block = cls(
            block_id=block_id, camera=str(state["camera"]), stamp_ns=int(state["stamp_ns"]), positions=state["positions"],
            key_mean=state["key_mean"], layers=layers, kind=str(state["kind"]), stream=str(state["stream"]),
            stamps_ns=tuple(int(s) for s in state["stamps_ns"]), rank=int(state["rank"]), protected=bool(state["protected"]),
            rep=state["rep"], tier=tier, revision=int(state["revision"]), poses=tuple(state["poses"]),
            # A state from before issue 36 has no span: none merged.
            span_end_ns=int(state.get("span_end_ns", 0)), frames_merged=int(state.get("frames_merged", 0)),
            span_end_pose=state.get("span_end_pose"), words=tuple(str(w) for w in state.get("words", ())),
        )
        if block.is_empty:
            raise ValueError(f"block {block_id} keeps nothing in any layer")
        return block


def newest_within(newest_first: Iterable[FrameBlock], max_tokens: int) -> list[FrameBlock]:
    """The blocks taken from ``newest_first`` while their encoded tokens fit in ``max_tokens``, in time
    order; the iterable is read only as far as the cut (callers pass lazy walks over a large store)."""
    out: list[FrameBlock] = []
    total = 0
    for block in newest_first:
        if total + block.n_tokens > max_tokens:
            break
        out.append(block)
        total += block.n_tokens
    out.reverse()
    return out


def recent_within(blocks: list[FrameBlock], max_tokens: int) -> list[FrameBlock]:
    """The longest suffix of ``blocks`` (time order) whose encoded tokens fit in ``max_tokens``."""
    return newest_within(reversed(blocks), max_tokens)


def present_in(blocks: Sequence[FrameBlock], n_layers: int) -> list[list[FrameBlock]]:
    """Per layer, the blocks that keep tokens in that layer (order kept)."""
    return [[b for b in blocks if b.layers[layer] is not None] for layer in range(n_layers)]
