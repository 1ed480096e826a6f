"""The front page's headline table is what ``bench.headline`` reads from the bench pages (issue 45: docs that
cannot drift), and its reader finds cells by heading, row and column, or says which one is missing."""

from __future__ import annotations

import pytest

from bench import headline
from bench.headline import BEGIN, END, Cell, Missing, Page, Source, read, render
from tests.unit.test_doc_links import github_anchors

PAGE = """# A bench page

<!-- bench:x:begin (generated) -->
## Results: something

|  |  |
|---|---|
| code | git 1234abc |
| date | 2026-11-20T10:00:00+00:00 |

### 60 frames a stream

| row | frames | accuracy |
|---|---|---|
| rekv @ 10% | 6 | 42/64 = 66% |
| full | 60 | 19/64 = 30% |

| row | other |
|---|---|
| rekv @ 10% | 7 |
<!-- bench:x:end -->

### A later hand-kept table

Run separately: code git
feedbee, 2026-11-21T09:00:00+00:00.

| row | accuracy |
|---|---|
| rekv @ 10% | 99/99 |
"""


@pytest.fixture()
def page(tmp_path):
    path = tmp_path / "x.md"
    path.write_text(PAGE)
    return {"x.md": Page(path)}


def test_a_cell_is_read_from_the_table_under_its_heading(page):
    assert read(Cell(Source("x.md", "60 frames a stream"), "full", "accuracy"), page) == "19/64 = 30%"
    assert read(Cell(Source("x.md", "60 frames a stream"), "rekv @ 10%", "other"), page) == "7"  # the second table
    assert read(Cell(Source("x.md", "A later hand-kept table"), "rekv @ 10%", "accuracy"), page) == "99/99"


def test_a_missing_heading_row_or_column_is_named(page):
    with pytest.raises(LookupError, match="0 headings 'No such'"):
        read(Cell(Source("x.md", "No such"), "full", "accuracy"), page)
    with pytest.raises(LookupError, match="0 rows 'mukv @ 10%'"):
        read(Cell(Source("x.md", "60 frames a stream"), "mukv @ 10%", "accuracy"), page)
    with pytest.raises(LookupError, match="no table with the column 'TTFT'"):
        read(Cell(Source("x.md", "60 frames a stream"), "full", "TTFT"), page)


def test_an_optional_row_absent_from_the_run_is_a_dash_and_read_when_present(page):
    src = Source("x.md", "60 frames a stream")
    assert read(Cell(src, "mukv @ 10%", "accuracy", optional=True), page) == "- (not in the page's latest run)"
    assert read(Cell(src, "full", "accuracy", optional=True), page) == "19/64 = 30%"
    with pytest.raises(LookupError, match="no table with the column 'TTFT'"):  # only the row may be absent
        read(Cell(src, "full", "TTFT", optional=True), page)


def test_a_row_not_measured_is_a_dash_with_its_reason(page):
    assert read(Missing("not run: too long"), page) == "- (not run: too long)"
    assert read(Missing(""), page) == "-"


def test_provenance_comes_from_the_run_that_wrote_the_table(page):
    assert page["x.md"].provenance("60 frames a stream") == "git 1234abc, 2026-11-20"
    assert page["x.md"].provenance("A later hand-kept table") == "git feedbee, 2026-11-21"


@pytest.mark.parametrize("heading", sorted({s.heading for s in (headline.HOUR, headline.VISUAL, headline.SHARED_VISUAL,
                                                                headline.TEXT)}))
def test_the_links_anchor_is_the_heading_githubs_way(heading):
    assert headline.slug(heading) in github_anchors(f"## {heading}\n")


def test_the_front_page_holds_what_the_pages_say():
    front = (headline.ROOT / headline.FRONT).read_text()
    assert BEGIN in front and END in front
    span = front[front.index(BEGIN) + len(BEGIN) : front.index(END)].strip()
    assert span == render().strip(), "docs/BENCHMARKS.md's headline table is stale: run `python -m bench.headline --write`"
