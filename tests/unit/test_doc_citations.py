"""Every document the code cites exists, and every section it names is a heading there (issue 45: docstrings
pointed at benchmark sections that had moved). test_doc_links.py checks the links between the documents; this
checks what the code, scripts, configs and Makefile say of them: ``docs/X.md``, ``docs/X.md#anchor``, and
``X.md, "Section"`` (a heading's words, any case and backticks aside, as a substring of one heading, or of the bold
title a list item opens with: ``- **Scoring continuations.** ...``)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.unit.test_doc_links import github_anchors

REPO = Path(__file__).resolve().parents[2]
SOURCES = sorted(p for d in ("videokv_node/videokv_node", "bench", "scripts", "tests", "launch", "config")
                 for p in (REPO / d).rglob("*") if p.suffix in (".py", ".sh", ".yaml", ".json", ".rviz")) + \
    [REPO / "Makefile", REPO / "Dockerfile"]
PATH = re.compile(r"(?<![\w/])(docs/[\w/.\-]+?\.md)(?:#([\w\-]+))?")
SECTION = re.compile(r"(?<![\w/])((?:docs/)?[\w/\-]*[A-Z_]+\.md|docs/[\w/.\-]+?\.md), (?:section )?\"([^\"\n]{3,80})\"")
WHERE = {"BENCHMARKS.md": "docs/BENCHMARKS.md"}  # a bare name the code cites, and the file it means


def citations(text: str) -> tuple[list[tuple[str, str | None]], list[tuple[str, str]]]:
    """(paths with their anchors, (file, section) pairs) cited in ``text``."""
    return ([(m.group(1), m.group(2)) for m in PATH.finditer(text)],
            [(WHERE.get(m.group(1), m.group(1)), m.group(2)) for m in SECTION.finditer(text)])


def headings(path: Path) -> list[str]:
    """The headings and list items' bold titles, lower case, backticks dropped."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    titles = re.findall(r"^#+\s+(.*)$", text, flags=re.M) + re.findall(r"^\s*[-*]\s+\*\*(.+?)\*\*", text, flags=re.M)
    return [t.strip().replace("`", "").lower() for t in titles]


def test_the_finder_reads_each_form():
    paths, sections = citations('see docs/bench/x.md#a-b and docs/OPS.md; docs/BENCHMARKS.md, "On a GPU", '
                                'BENCHMARKS.md, section "Reading"')
    assert paths == [("docs/bench/x.md", "a-b"), ("docs/OPS.md", None), ("docs/BENCHMARKS.md", None)]
    assert sections == [("docs/BENCHMARKS.md", "On a GPU"), ("docs/BENCHMARKS.md", "Reading")]


def test_headings_hold_titles_and_bold_list_items(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("# Top\n### `rekv`: temporal contrast\n- **Scoring continuations.** text\n```\n# code\n```\n")
    assert headings(doc) == ["top", "rekv: temporal contrast", "scoring continuations."]


def test_every_cited_document_and_section_exists():
    missing = []
    for source in SOURCES:
        if source == Path(__file__):
            continue
        paths, sections = citations(source.read_text(errors="ignore"))
        where = source.relative_to(REPO)
        for path, anchor in paths:
            doc = REPO / path
            if not doc.is_file():
                missing.append(f"{where}: {path} does not exist")
            elif anchor and anchor not in github_anchors(doc.read_text()):
                missing.append(f"{where}: {path} has no heading #{anchor}")
        for path, section in sections:
            doc = REPO / path
            if not doc.is_file() or not any(section.replace("`", "").lower() in h for h in headings(doc)):
                missing.append(f"{where}: {path} has no section {section!r}")
    assert not missing, "\n".join(missing)
