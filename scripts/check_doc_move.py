"""Check that moving Markdown text between files lost nothing: ``python scripts/check_doc_move.py REV [FILE]``.

Compares FILE (default README.md) as it was at git revision REV with the Markdown now in the
work tree (README.md and docs/**/*.md together). Every unit of the old text must still appear
somewhere in the new text, whitespace and heading levels ignored:

- each line of every fenced code block (commands, message definitions, YAML, diagrams);
- each table row, cell by cell;
- each inline code span (`...`);
- each number;
- each prose sentence, with Markdown links reduced to their text (a link's target changes
  when the text moves to docs/).

Prints the units that are missing, by kind, and exits 1 if any are. A sentence reworded
because it named its old place ("see ... below") is reported too: read those by hand.
Used for issue 19 (README -> docs/) and issue 35 (docs/BENCHMARKS.md -> docs/bench/, docs/notes/).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
NUMBER = re.compile(r"(?<![\w.])\d[\d,.]*\d|(?<![\w.])\d(?![\w])")
SENTENCE_END = re.compile(r"(?<=[.;!?])\s+(?=[A-Z`(\"*])")


def squash(text: str) -> str:
    """One space for any run of whitespace, no Markdown link targets."""
    return " ".join(LINK.sub(r"\1", text).split())


def split_markdown(text: str) -> tuple[list[str], list[list[str]], list[str]]:
    """(code lines, table rows as cell lists, prose paragraphs) of a Markdown text."""
    code, rows, prose, para, fenced = [], [], [], [], False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            if stripped:
                code.append(" ".join(stripped.split()))
            continue
        if stripped.startswith("|"):
            cells = [squash(c) for c in stripped.strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                rows.append(cells)
            continue
        if not stripped:
            if para:
                prose.append(" ".join(para))
            para = []
            continue
        if stripped.startswith("#"):  # a heading is a paragraph of its own
            if para:
                prose.append(" ".join(para))
            prose.append(stripped.lstrip("#").strip())
            para = []
            continue
        para.append(stripped)
    if para:
        prose.append(" ".join(para))
    return code, rows, prose


def units(text: str) -> dict[str, list[str]]:
    """The units of a text that must survive a move, by kind."""
    code, rows, prose = split_markdown(text)
    outside_code = "\n".join(prose + [" | ".join(r) for r in rows])
    sentences = [s for p in prose for s in SENTENCE_END.split(squash(p)) if s]
    return {
        "code line": code,
        "table row": [" | ".join(r) for r in rows],
        "code span": sorted(set(CODE_SPAN.findall(outside_code))),
        "number": sorted(set(NUMBER.findall(text))),
        "sentence": sentences,
    }


def missing_units(old: str, new_texts: list[str]) -> dict[str, list[str]]:
    """Units of ``old`` found nowhere in ``new_texts`` (each unit searched in the whole new text)."""
    new = "\n".join(new_texts)
    new_code, new_rows, new_prose = split_markdown(new)
    haystack = {
        "code line": "\n".join(new_code),
        "table row": "\n".join(" | ".join(r) for r in new_rows),
        "code span": "\n".join(new_prose + [" | ".join(r) for r in new_rows]),
        "number": squash(new),
        "sentence": squash("\n\n".join(new_prose) + "\n\n" + "\n".join(" ".join(r) for r in new_rows)),
    }
    out = {}
    for kind, items in units(old).items():
        hay = haystack[kind]
        if kind == "code span":
            lost = [u for u in items if f"`{u}`" not in hay]
        elif kind == "code line":
            lost = [u for u in items if u not in hay.splitlines() and u not in hay]
        else:
            lost = [u for u in items if u not in hay]
        out[kind] = lost
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev", help="git revision holding the text before the move")
    ap.add_argument("file", nargs="?", default="README.md", help="the file the text was moved out of")
    args = ap.parse_args(argv)
    old = subprocess.run(["git", "show", f"{args.rev}:{args.file}"], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    new_files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    lost = missing_units(old, [p.read_text() for p in new_files])
    total = 0
    for kind, n in ((k, len(v)) for k, v in units(old).items()):
        print(f"{kind}s: {n} in {args.rev}:{args.file}, {n - len(lost[kind])} found in README.md + docs/**/*.md")
    for kind, items in lost.items():
        for item in items:
            print(f"MISSING {kind}: {item}")
        total += len(items)
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
