"""Temporal grounding: are the frames an answer cites, or ``~/locate`` ranks first, when the answer was visible?

A question file may give each question its ground-truth **time spans** (``time_spans``:
``[[start, end], ...]`` in seconds from the stream's start, as ``end_time``): when the thing
asked about was in view. Without them, its ``evidence_stamps`` (the needle frames) count as
spans of zero length. Measures, with stamps matching a span within ``TOLERANCE_NS``:

- ``recall_at_k``: the share of spans holding at least one of the top ``k`` ranked moments
  (``~/locate``'s order); with one span, 1 if a top-k moment is in it;
- ``distance_s``: how far, in seconds, a stamp lies from the nearest span (0 inside one):
  for the top-ranked moment, the error a planner sent there would make;
- ``span_recall``: the share of spans holding at least one of an answer's evidence frames
  (unranked: the answer attended to all of them);
- ``in_span``: the share of an answer's evidence frames that lie in a span (what of its
  context was about the question).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

NS_PER_S = 1_000_000_000
TOLERANCE_NS = 1_000_000  # 1 ms: stamps in question files are seconds with a few decimals

Span = tuple[int, int]  # (start ns, end ns), start <= end


def spans_ns(time_spans: Iterable[tuple[float, float]], evidence_stamps: Iterable[float], origin_ns: int = 0) -> list[Span]:
    """A question's spans in header-stamp nanoseconds: its ``time_spans``, else each evidence stamp as a point."""
    spans = [(origin_ns + round(a * NS_PER_S), origin_ns + round(b * NS_PER_S)) for a, b in time_spans]
    if not spans:
        spans = [(origin_ns + round(s * NS_PER_S),) * 2 for s in evidence_stamps]
    return spans


def distance_s(stamp_ns: int, spans: Sequence[Span], tolerance_ns: int = TOLERANCE_NS) -> float:
    """Seconds from ``stamp_ns`` to the nearest span (0 inside one, or within the tolerance of one)."""
    if not spans:
        raise ValueError("no spans to measure against")
    gaps = [max(a - stamp_ns, stamp_ns - b, 0) for a, b in spans]
    gap = min(gaps)
    return 0.0 if gap <= tolerance_ns else gap / NS_PER_S


def _hits(span: Span, stamps: Iterable[int], tolerance_ns: int) -> bool:
    a, b = span
    return any(a - tolerance_ns <= s <= b + tolerance_ns for s in stamps)


def recall_at_k(ranked_ns: Sequence[int], spans: Sequence[Span], k: int, tolerance_ns: int = TOLERANCE_NS) -> float | None:
    """Share of spans holding one of the first ``k`` ranked stamps; None without spans."""
    if not spans:
        return None
    top = list(ranked_ns[:k])
    return sum(_hits(span, top, tolerance_ns) for span in spans) / len(spans)


def span_recall(evidence_ns: Iterable[int], spans: Sequence[Span], tolerance_ns: int = TOLERANCE_NS) -> float | None:
    """Share of spans holding one of the evidence stamps; None without spans."""
    if not spans:
        return None
    evidence = list(evidence_ns)
    return sum(_hits(span, evidence, tolerance_ns) for span in spans) / len(spans)


def in_span(evidence_ns: Sequence[int], spans: Sequence[Span], tolerance_ns: int = TOLERANCE_NS) -> float | None:
    """Share of the evidence stamps lying in some span; None without spans or without evidence."""
    if not spans or not evidence_ns:
        return None
    return sum(distance_s(s, spans, tolerance_ns) == 0.0 for s in evidence_ns) / len(evidence_ns)
