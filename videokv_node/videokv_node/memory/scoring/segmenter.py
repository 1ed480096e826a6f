"""StreamKV's semantic segment partitioning (Sec. "Semantic Segment Partitioning"), online.

Frames arrive one at a time with their vision-encoder features f_t (T, D). A
frame whose cosine similarity s_t to the previous frame (Eq. 1) falls below a
threshold starts a new segment; segments are at least ``min_frames`` long
(the exclusion window) and an open segment holds at most ``max_frames``
members, the most similar adjacent pair being merged when it would overflow.

Similarity: Eq. (1) compares f_{t-1} and f_t in R^{P^2 x D}, i.e. the cosine of the
flattened token features (``similarity: tokens``, the robot default); StreamKV's public
code compares the features' means over the tokens (``similarity: mean``, the paper
preset, because the paper's threshold 0.99 was set with that code: token-level cosines
of adjacent frames rarely reach 0.99, so ``tokens`` splits at almost every frame).

Departures from the paper, forced by streaming:

- The exclusion window is applied *after* a boundary only: a low s_t is
  ignored while the open segment has fewer than ``min_frames`` members. The
  paper's window is "around each boundary", which needs look-ahead; online, a
  segment cannot be held back waiting for frames that may show another change.
  The last segment, closed by ``flush``, may be shorter.
- Boundaries always compare raw adjacent frames (f_{t-1}, f_t), whatever was
  merged; merging concerns only how a segment is stored, not where it ends.
- Counting members or original frames for ``min_frames`` is the same decision:
  members only fall behind frames after a merge, which happens at
  ``max_frames >= min_frames`` members.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from videokv_node.memory.config import ConfigError


@dataclass(slots=True)
class SegmenterConfig:
    threshold: float = 0.99  # s_t below this marks a boundary; in [-1, 1] (-1: never split, 1: split on any change)
    min_frames: int = 4  # m: a low s_t does not close a segment with fewer members than this
    max_frames: int = 64  # M: an open segment never holds more members; >= min_frames
    similarity: str = "tokens"  # tokens: Eq. (1) on the flattened (T, D) features; mean: on the token means (D,), StreamKV's code

    def __post_init__(self) -> None:
        if not (isinstance(self.threshold, (int, float)) and -1.0 <= self.threshold <= 1.0):
            raise ConfigError(f"segmenter.threshold must be a cosine similarity in [-1, 1], got {self.threshold!r}")
        if self.similarity not in ("tokens", "mean"):
            raise ConfigError(f"segmenter.similarity must be tokens or mean, got {self.similarity!r}")
        if self.min_frames < 1:
            raise ConfigError(f"segmenter.min_frames must be >= 1, got {self.min_frames}")
        if self.max_frames < self.min_frames:
            raise ConfigError(
                f"segmenter.max_frames ({self.max_frames}) must be >= segmenter.min_frames ({self.min_frames}): "
                "a segment must be able to reach the length that allows it to close"
            )


@dataclass(slots=True)
class Member:
    """One stored frame of a segment, possibly several original frames merged into their mean.

    Invariants: ``weight == len(item_ids)``; ``item_ids`` are consecutive pushed
    ids in push order; ``feature`` is the mean of those frames' features.
    """

    item_ids: list[int]  # original ids this member stands for, in push order
    feature: torch.Tensor  # (T, D), float32 or float64: the mean of the covered frames
    weight: int  # number of original frames covered


@dataclass(slots=True)
class Segment:
    """A closed segment: its members in time order. Never changed by the segmenter once returned."""

    members: list[Member]  # non-empty, in push order

    @property
    def first_item_id(self) -> int:
        return self.members[0].item_ids[0]

    @property
    def last_item_id(self) -> int:
        return self.members[-1].item_ids[-1]

    @property
    def item_ids(self) -> list[int]:
        """Every original id covered, in push order."""
        return [i for m in self.members for i in m.item_ids]

    @property
    def n_frames(self) -> int:
        """Original frames covered (T_i counts members; this counts what was pushed)."""
        return sum(m.weight for m in self.members)

    def summary_feature(self) -> torch.Tensor:
        """f_s: the mean of all original frames' features at each spatial location, (T, D).

        Weighted by member weight, so merges do not bias it towards merged frames.
        """
        total = torch.stack([m.feature * m.weight for m in self.members]).sum(dim=0)  # (T, D)
        return total / self.n_frames


def _similarity(a: torch.Tensor, b: torch.Tensor, kind: str) -> float:
    """s_t of two (T, D) features: Eq. (1) on the flattened features (``tokens``) or on their
    means over the T tokens (``mean``: StreamKV's public code; a (D,) vector per frame)."""
    return _cosine(a.mean(0), b.mean(0)) if kind == "mean" else _cosine(a, b)


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Eq. (1) on flattened features; 0 if either is zero.

    ab / sqrt(aa * bb) in double rather than ab / (|a| |b|): for a == b the dot
    products are bit-identical and sqrt(x * x) == x, so identical frames score
    exactly 1.0 and never split, even at threshold 1.
    """
    a, b = a.reshape(-1), b.reshape(-1)  # (T * D,)
    ab, aa, bb = float(a @ b), float(a @ a), float(b @ b)
    denom = math.sqrt(aa * bb)
    return ab / denom if denom > 0.0 else 0.0


class SemanticSegmenter:
    """Online semantic segmentation of one stream of frame features.

    Guarantees: ``push`` returns at most one closed segment; every closed segment
    has between 1 and ``max_frames`` members, and at least ``min_frames`` unless
    closed by ``flush``; the member ids of all segments, closed then pending,
    are exactly the pushed ids in push order.
    """

    def __init__(self, config: SegmenterConfig) -> None:
        self.config = config
        self._members: list[Member] = []  # the open segment
        self._sims: list[float] = []  # (len(_members) - 1,): similarity of members i and i + 1
        self._last_frame: torch.Tensor | None = None  # raw f_{t-1}, for Eq. (1); None at a segment start
        self._last_id: int | None = None  # ids must increase strictly until reset
        self._shape: tuple[int, ...] | None = None  # (T, D) of every frame until reset

    @property
    def pending(self) -> list[Member]:
        """The open segment's members, in time order (a copy of the list; members are shared)."""
        return list(self._members)

    @property
    def pending_similarities(self) -> list[float]:
        """Cosine similarity of each adjacent pair of pending members (len(pending) - 1 values)."""
        return list(self._sims)

    def push(self, item_id: int, feature: torch.Tensor) -> list[Segment]:
        """Add frame ``item_id`` with its feature (T, D); return the segment this closes, if any.

        Raises ValueError if ``item_id`` does not increase or the feature shape
        changes: both would break the id partition or the per-location mean.
        """
        if feature.dim() != 2:
            raise ValueError(f"segmenter: feature must be (T, D), got shape {tuple(feature.shape)}")
        if self._shape is not None and tuple(feature.shape) != self._shape:
            raise ValueError(f"segmenter: feature shape {tuple(feature.shape)} differs from {self._shape}")
        if self._last_id is not None and item_id <= self._last_id:
            raise ValueError(f"segmenter: item ids must increase, got {item_id} after {self._last_id}")
        # Held at >= float32: the summary is a mean over many frames, bf16 would drift. Copied: callers reuse buffers.
        dtype = torch.promote_types(feature.dtype, torch.float32)
        frame = feature.detach().to(dtype=dtype, copy=True)  # (T, D)
        self._shape, self._last_id = tuple(frame.shape), item_id

        closed: list[Segment] = []
        if self._members:
            s_t = _similarity(self._last_frame, frame, self.config.similarity)  # Eq. (1)
            if s_t < self.config.threshold and len(self._members) >= self.config.min_frames:
                closed.append(self._close())
            else:
                last = self._members[-1]
                # A single-frame member is f_{t-1} itself, so s_t is already its similarity.
                self._sims.append(s_t if last.weight == 1 else _similarity(last.feature, frame, self.config.similarity))
        self._members.append(Member([item_id], frame, 1))
        self._last_frame = frame
        if len(self._members) > self.config.max_frames:
            self._merge_most_similar()
        return closed

    def flush(self) -> Segment | None:
        """Close the open segment whatever its length (end of stream); None if nothing is pending."""
        if not self._members:
            return None
        segment = self._close()
        self._last_frame = None
        return segment

    def reset(self) -> None:
        """Forget everything, the open segment included (call ``flush`` first to keep it)."""
        self._members, self._sims = [], []
        self._last_frame, self._last_id, self._shape = None, None, None

    def state(self) -> tuple[dict, dict[str, torch.Tensor]]:
        """The open segment, for a snapshot: JSON-able dict + tensors (``features`` (n, T, D) of the
        members, ``last_frame`` (T, D) when set). ``load_state`` of it gives a segmenter whose
        every future ``push`` and ``flush`` returns what this one's would."""
        meta = {
            "members": [{"item_ids": list(m.item_ids), "weight": m.weight} for m in self._members],
            "similarities": list(self._sims),  # floats: JSON keeps a float's repr, so they round-trip exactly
            "last_id": self._last_id,
            "shape": list(self._shape) if self._shape is not None else None,
        }
        tensors = {}
        if self._members:
            tensors["features"] = torch.stack([m.feature for m in self._members])  # (n, T, D)
        if self._last_frame is not None:
            tensors["last_frame"] = self._last_frame
        return meta, tensors

    def load_state(self, meta: dict, tensors: dict[str, torch.Tensor]) -> None:
        """Replace the whole state by one ``state`` returned; raises ValueError, changing nothing,
        on a state that breaks an invariant or this config (more members than ``max_frames``)."""
        members_meta = meta["members"]
        sims = [float(x) for x in meta["similarities"]]
        last_id = None if meta["last_id"] is None else int(meta["last_id"])
        shape = None if meta["shape"] is None else tuple(int(x) for x in meta["shape"])
        features = tensors.get("features")
        last_frame = tensors.get("last_frame")
        n = len(members_meta)
        if n > self.config.max_frames:
            raise ValueError(f"the open segment has {n} members, more than segmenter.max_frames ({self.config.max_frames})")
        if len(sims) != max(n - 1, 0):
            raise ValueError(f"the open segment has {n} members but {len(sims)} adjacent similarities")
        if n and (features is None or shape is None or tuple(features.shape) != (n, *shape)):
            raise ValueError(f"the open segment's features are {None if features is None else tuple(features.shape)}, want ({n}, {shape})")
        if last_frame is not None and tuple(last_frame.shape) != shape:
            raise ValueError(f"the last frame is {tuple(last_frame.shape)}, want {shape}")
        rows = list(features) if n and features is not None else []  # features[i]; not None with members (checked above)
        members, ids = [], []
        for i, m in enumerate(members_meta):
            item_ids = [int(x) for x in m["item_ids"]]
            if not item_ids or int(m["weight"]) != len(item_ids):
                raise ValueError(f"open segment member {i}: weight {m['weight']} for {len(item_ids)} frames")
            members.append(Member(item_ids, rows[i].clone(), len(item_ids)))
            ids += item_ids
        if ids != sorted(set(ids)) or (ids and (last_id is None or ids[-1] > last_id)):
            raise ValueError(f"the open segment's frame ids {ids} do not increase up to the last id {last_id}")
        self._members, self._sims = members, sims
        self._last_frame, self._last_id, self._shape = last_frame, last_id, shape

    def _close(self) -> Segment:
        segment = Segment(self._members)
        self._members, self._sims = [], []
        return segment

    def _merge_most_similar(self) -> None:
        """Merge the most similar adjacent pair (the earliest among equals) into their weighted mean."""
        i = max(range(len(self._sims)), key=lambda j: (self._sims[j], -j))
        a, b = self._members[i], self._members[i + 1]
        weight = a.weight + b.weight
        feature = (a.feature * a.weight + b.feature * b.weight) / weight  # (T, D)
        merged = Member(a.item_ids + b.item_ids, feature, weight)
        self._members[i : i + 2] = [merged]
        del self._sims[i]  # sims[i] joined a and b; the neighbours' entries are now i - 1 and i
        if i > 0:
            self._sims[i - 1] = _similarity(self._members[i - 1].feature, feature, self.config.similarity)
        if i < len(self._sims):
            self._sims[i] = _similarity(feature, self._members[i + 1].feature, self.config.similarity)
