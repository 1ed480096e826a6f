"""The benchmark book (issue 35): every generated section lives on its own page of docs/bench/, between
the markers its writer replaces, and the front page docs/BENCHMARKS.md holds one generated span, the headline
table ``bench.headline`` reads from the pages, so that ``make bench*`` rewrites the detail pages and never the
front page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import accuracy, grounding, hour_report, hour_ros, load, locate_things, long_stream, memory_policies, report, scaling, snapshots, spava_prefill, still, things, things_hour, vision_backends
from videokv_node.tinyvlm import option_wording
from videokv_node.tinyvlm import report as tiny_report

REPO = Path(__file__).resolve().parents[2]
# (page, begin, end) of every generated span, as each writer names it
SPANS = [
    (report.DOC, report.BEGIN, report.END),
    (memory_policies.DOC, memory_policies.BEGIN, memory_policies.END),
    (vision_backends.DOC, vision_backends.BEGIN, vision_backends.END),
    (vision_backends.DOC, vision_backends.BEGIN_GPU, vision_backends.END_GPU),
    (accuracy.DOC, accuracy.BEGIN, accuracy.END),
    (accuracy.DOC, accuracy.VISUAL_BEGIN, accuracy.VISUAL_END),
    (accuracy.SCORING_DOC, accuracy.SCORING_BEGIN, accuracy.SCORING_END),
    *((long_stream.DOC, begin, end) for begin, end in long_stream.MARKERS.values()),
    (grounding.DOC, grounding.BEGIN, grounding.END),
    (locate_things.DOC, locate_things.BEGIN, locate_things.END),
    (str(snapshots.DOC.relative_to(REPO)), snapshots.BEGIN, snapshots.END),
    (scaling.DOC, scaling.BEGIN, scaling.END),
    (spava_prefill.DOC, spava_prefill.BEGIN, spava_prefill.END),
    (tiny_report.DOC, tiny_report.BEGIN, tiny_report.END),
    (tiny_report.DOC, tiny_report.GEN_BEGIN, tiny_report.GEN_END),
    (option_wording.DOC, option_wording.BEGIN, option_wording.END),
    *((hour_report.DOC, *hour_report.span_markers(span)) for span in hour_report.SPANS),
    (hour_report.DOC, *hour_ros.MARKERS),
    (still.DOC, *still.MARKERS),
    (things.DOC, *things.MARKERS),
    (things_hour.DOC, *things_hour.MARKERS),
    ("docs/bench/load.md", *load.LATEST),
]


@pytest.mark.parametrize("page, begin, end", SPANS, ids=lambda v: v if v.endswith(".md") else "")
def test_each_generated_span_is_once_on_its_page(page, begin, end):
    assert page.startswith("docs/bench/"), page
    text = (REPO / page).read_text()
    assert text.count(begin) == 1 and text.count(end) == 1, f"{page}: {begin!r}"
    assert text.index(begin) < text.index(end)


def test_every_span_on_the_pages_has_a_writer():
    named = {begin for _, begin, _ in SPANS}
    found = {m for page in (REPO / "docs" / "bench").glob("*.md") for m in re.findall(r"<!-- [\w:-]+:begin .*?-->", page.read_text())}
    assert found == named


def test_front_page_holds_only_the_headline_span():
    """Runs write their pages; the front page's one generated span is the headline table read from them
    (bench/headline.py, issue 45), the rest of it hand-written."""
    front = (REPO / "docs" / "BENCHMARKS.md").read_text()
    assert re.findall(r"<!-- [\w:-]+:(?:begin|end)\b", front) == ["<!-- bench:headline:begin", "<!-- bench:headline:end"]
    assert len(front.splitlines()) <= 320  # a front page, not a lab notebook
