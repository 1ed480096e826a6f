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

A frame matches a needle stamp within ``TOLERANCE_NS`` (stamps in a question file are given
in seconds, with a few decimals).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

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
