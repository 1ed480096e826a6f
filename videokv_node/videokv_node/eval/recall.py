"""Needle recall: did the answer attend to the frames that hold its answer?

Accuracy alone cannot tell whether a memory lost a fact (retrieval, eviction) or kept it and
the model misread it. A question file may give each question its ground-truth evidence, the
stream times of the frames that hold the answer (``evidence_stamps``, seconds from the
stream's start, as ``end_time``); the evaluation then reports, per question:

- ``needle_recall``: the share of those frames among the frames the answer attended to in
  **any** layer (the answer's ``evidence_stamps``, the union over layers). 1.0: every needle
  frame reached the question in at least one layer.
- ``needle_recall_layers``: the mean over layers of the share of needle frames that layer
  attended to (per-layer retrieval may fetch a needle in some layers only). Known where the
  per-layer choice is visible (the in-process engine); None through the node.
- ``needle_token_share``: the mean over layers and needle frames of the share of the needle's
  tokens the layer attended to (``memory/context/attended.py``). Frame-level policies keep whole
  frames, so it equals the per-layer recall; a token-level one (HERMES, MuKV) may keep a needle
  "attended" in every layer by one token of it, which the frame columns count as kept and
  this one does not. Known where the per-layer choice is visible.

A frame matches a needle stamp within ``TOLERANCE_NS`` (stamps in a question file are given
in seconds, with a few decimals).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

TOLERANCE_NS = 1_000_000  # 1 ms


def _share(needles_ns: Sequence[int], attended_ns: Iterable[int], tolerance_ns: int) -> float:
    attended = sorted(attended_ns)
    hit = sum(any(abs(a - n) <= tolerance_ns for a in attended) for n in needles_ns)
    return hit / len(needles_ns)


def needle_recall(needles_ns: Sequence[int], evidence_ns: Iterable[int], layer_evidence_ns: Sequence[Iterable[int]] | None = None,
                  tolerance_ns: int = TOLERANCE_NS) -> tuple[float | None, float | None]:
    """(recall in any layer, mean recall over layers) of the needle stamps; (None, None) without needles,
    and the second None when the per-layer evidence is unknown (``layer_evidence_ns`` None or empty)."""
    if not needles_ns:
        return None, None
    any_layer = _share(needles_ns, evidence_ns, tolerance_ns)
    if not layer_evidence_ns:
        return any_layer, None
    per_layer = [_share(needles_ns, layer, tolerance_ns) for layer in layer_evidence_ns]
    return any_layer, sum(per_layer) / len(per_layer)


def needle_token_share(needles_ns: Sequence[int], layer_shares: Sequence[Mapping[int, float]] | None,
                       tolerance_ns: int = TOLERANCE_NS) -> float | None:
    """Mean over layers, then over needle frames, of the share of the needle's tokens the layer attended
    to (``layer_shares[layer]``: {frame stamp: share}, ``VideoMemoryEngine.last_layer_token_share``); a needle
    absent from a layer counts 0 there. None without needles or without per-layer shares."""
    if not needles_ns or not layer_shares:
        return None
    per_layer = []
    for shares in layer_shares:
        got = [max((v for s, v in shares.items() if abs(s - n) <= tolerance_ns), default=0.0) for n in needles_ns]
        per_layer.append(sum(got) / len(got))
    return sum(per_layer) / len(per_layer)


def frames_touched(layer_shares: Sequence[Mapping[int, float]] | None) -> float | None:
    """Mean over layers of the number of frames of which the layer attended at least one token.

    Beside the budget (frames' worth of tokens), this says how a token-level policy spent it: HERMES
    or MuKV can spread a budget of k frames over many more frames, each kept in part. A frame-level
    policy touches exactly the frames it keeps. None without per-layer shares."""
    if not layer_shares:
        return None
    return sum(sum(1 for v in shares.values() if v > 0.0) for shares in layer_shares) / len(layer_shares)
