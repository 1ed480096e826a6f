"""Every relative link in README.md and docs/**/*.md reaches a file, and an anchor a heading of it (issue 19:
the README's reference parts moved to docs/, and a moved section must not leave dead links behind)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]  # docs/bench/ and docs/notes/ too (issue 35)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    anchors = set()
    for line in re.sub(r"```.*?```", "", markdown, flags=re.S).splitlines():
        heading = re.match(r"^#+\s+(.*)", line)
        if heading:
            anchors.add(re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-"))
    return anchors


def test_anchor_rule_on_known_headings():
    assert github_anchors("## Running all day: crash-safe memory\n") == {"running-all-day-crash-safe-memory"}
    assert github_anchors("```\n# not a heading\n```\n# `~/ask` and ~/locate\n") == {"ask-and-locate"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(doc):
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.S)
    dead = []
    for link in LINK.findall(text):
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = (doc.parent / path) if path else doc
        if not target.exists():
            dead.append(f"{link}: no such file")
        elif anchor and target.suffix == ".md" and anchor not in github_anchors(target.read_text()):
            dead.append(f"{link}: no heading with that anchor in {target.name}")
    assert not dead, "\n".join(dead)
