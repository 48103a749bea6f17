"""Citations of the design notes resolve: a comment that sends a reader to docs/ must land on a real heading.

Two forms are recognised, ``docs/<file>.md §<section>`` (a ``## §<section> ...`` heading) and
``docs/<file>.md "<heading>"`` (a ``##`` heading with exactly that text); a bare ``docs/<file>.md``
must name an existing file.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CODE_DIRS = ("agentflow_core", "tasks", "flows", "tests")
CITATION = re.compile(
    r'docs/(?P<file>[A-Za-z0-9_.-]+\.md)(?:\s+§(?P<section>\d+(?:\.\d+)*)|\s+"(?P<heading>[^"\n]+)")?'
)
HEADING = re.compile(r"^#{1,6}\s+(?P<text>.+?)\s*$", re.MULTILINE)
# Citations of documents a reader of the repository does not have.
OLD_STYLE = re.compile(r"\bseed (?:§|0\d\d\b)|\bthe seed's\b|(?-i:STACK-NOTES)|\bissue #?\d+", re.IGNORECASE)


def headings(path: Path) -> list[str]:
    """The text of every Markdown heading in ``path``."""
    return [m["text"] for m in HEADING.finditer(path.read_text(encoding="utf-8"))]


def broken_citations(text: str, docs: Path = DOCS) -> list[str]:
    """Every citation in ``text`` that names a missing file, section or heading."""
    broken = []
    for m in CITATION.finditer(text):
        target = docs / m["file"]
        if not target.is_file():
            broken.append(f"{m[0]}: no such file")
            continue
        titles = headings(target)
        if m["section"] and not any(t.split()[0] == f"§{m['section']}" for t in titles):
            broken.append(f"{m[0]}: no heading '§{m['section']} ...'")
        if m["heading"] and m["heading"] not in titles:
            broken.append(f"{m[0]}: no heading {m['heading']!r}")
    return broken


def sources() -> list[Path]:
    """The Python modules of the repository, this file excepted, plus the Markdown docs."""
    files = [p for d in CODE_DIRS for p in sorted((ROOT / d).rglob("*.py")) if p.resolve() != Path(__file__).resolve()]
    return [*files, *sorted(DOCS.glob("*.md")), ROOT / "README.md"]


def test_checker_rejects_a_missing_file_section_and_heading() -> None:
    text = 'x (docs/nope.md §1) y (docs/design.md §9.9) z (docs/stack-notes.md "Not a heading")'
    assert len(broken_citations(text)) == 3


def test_checker_accepts_existing_citations() -> None:
    assert broken_citations('(docs/design.md §2.1) (docs/design-003.md §2.2) (docs/stack-notes.md "YAML")') == []


def test_every_docs_citation_resolves() -> None:
    broken = [f"{p.relative_to(ROOT)}: {b}" for p in sources() for b in broken_citations(p.read_text(encoding="utf-8"))]
    assert broken == []


def test_no_module_cites_documents_outside_the_repository() -> None:
    old = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in sources()
        if p.suffix == ".py"
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if OLD_STYLE.search(line)
    ]
    assert old == []
