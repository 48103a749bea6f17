"""The docs describe the project as it is: no history of the work, every cited path exists, a short README, a site.

History (which session or round measured what, which issue asked for it, who merged it) belongs to the dated
notes under ``docs/measurements/``, which are exempt; README.md, BENCHMARKS.md and every other page are not.
A repository path cited in backticks must exist in git's tree, unless git ignores it (a generated output such
as ``data/variants/catalogue.parquet``); spans with placeholders or globs (``<run>``, ``*``, ``{md,html}``) are
patterns, not paths, and are not checked.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
MEASUREMENTS = DOCS / "measurements"
README_MAX_LINES = 250

HISTORY = re.compile(
    r"\b(?:this|previous|earlier|last|next|later|another|same|that|other|former) sessions?\b"
    r"|\bsessions? \d+"
    r"|\b(?:round|iteration|sprint) \d+\b(?! ?[x×%])"
    r"|\bissues? #?\d+"
    r"|\b(?:PR|pull request) #?\d+"
    r"|\bmerged (?:this|that|it|them|into)\b|\b(?:was|were|been|got) merged\b"
    r"|\blanded\b|\bthe integrator\b|\bthis branch\b"
    r"|\bcommit [0-9a-f]{7,40}\b",
    re.IGNORECASE,
)
PATH_PREFIXES = [
    "agentflow_core/",
    "agentflow_refund/",
    "tasks/",
    "flows/",
    "configs/",
    "tests/",
    "bin/",
    "docs/",
    "data/",
]
CODE_SPAN = re.compile(r"`([^`\n]+)`")
PATH_TOKEN = re.compile(r"(?<![\w./-])((?:" + "|".join(map(re.escape, PATH_PREFIXES)) + r")[\w./-]*)")
PATTERN_CHARS = set("<>*{}[]$")


def doc_files() -> list[Path]:
    """README.md, BENCHMARKS.md and every page under docs/ except the dated measurement notes."""
    pages = [p for p in sorted(DOCS.rglob("*.md")) if MEASUREMENTS not in p.parents]
    return [ROOT / "README.md", ROOT / "BENCHMARKS.md", *pages]


def history_lines(text: str) -> list[str]:
    """The lines of ``text`` that narrate the history of the work."""
    return [line.strip() for line in text.splitlines() if HISTORY.search(line)]


def cited_paths(text: str) -> set[str]:
    """Repository paths cited inside backticks, without placeholders or globs, trailing punctuation stripped."""
    paths = set()
    for span in CODE_SPAN.findall(text):
        for token in PATH_TOKEN.findall(span):
            rest = span[span.index(token) + len(token) :][:1]
            if rest and rest in PATTERN_CHARS:
                continue
            path = token.rstrip(".,:;/")
            if path.count("/") and not any(c in PATTERN_CHARS for c in path):
                paths.add(path)
    return paths


@cache
def tracked() -> frozenset[str]:
    """Every file and folder git tracks (folders as the prefixes of its files)."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    names: set[str] = set()
    for f in filter(None, out.split("\0")):
        parts = f.split("/")
        names.update("/".join(parts[:i]) for i in range(1, len(parts) + 1))
    return frozenset(names)


def ignored(path: str) -> bool:
    """Whether git ignores ``path`` (a generated output that a run or a benchmark writes)."""
    # a folder pattern (``/data/refund/``) matches only a name ending in a slash when the folder is absent
    return any(
        subprocess.run(["git", "check-ignore", "-q", "--no-index", name], cwd=ROOT).returncode == 0
        for name in (path, f"{path}/")
    )


def missing_paths(text: str) -> list[str]:
    """Cited paths that are neither in git's tree nor ignored as generated outputs."""
    return sorted(p for p in cited_paths(text) if p not in tracked() and not ignored(p))


@pytest.mark.parametrize(
    "line",
    [
        "Measured in session 19 on the 2-core machine.",
        "On session 20's machine the ratio was 1.5.",
        "the previous session left it at 0.9",
        "as this session's runs show",
        "the machines of earlier sessions",
        "Round 3 added the offline stage.",
        "One learner path ({} 12, item 6)".format("issue"),  # spelt apart: tests/test_docs.py bans the phrase in code
        "after the integrator merged this code",
        "The fix landed last week.",
        "The change was merged into main.",
        "Before = commit 2906cd5, after = this branch",
    ],
)
def test_a_planted_history_line_is_caught(line: str) -> None:
    assert history_lines(f"A first line.\n{line}\nA last line.\n") == [line]


@pytest.mark.parametrize(
    "line",
    [
        "a session older than `session_timeout_steps` expires",
        "measured on the previous test split",
        "`--rounds 2`: static and tuned alternating, 1.61× and 0.84× in rounds of one",
        "the champion's previous cycle keeps its report",
        "batches merged with Chan et al.'s update",
    ],
)
def test_descriptions_are_not_mistaken_for_history(line: str) -> None:
    assert history_lines(line) == []


def test_no_history_narrative_outside_the_measurement_notes() -> None:
    found = [f"{p.relative_to(ROOT)}: {line}" for p in doc_files() for line in history_lines(p.read_text("utf-8"))]
    assert found == []


def test_cited_paths_are_checked() -> None:
    text = "`tasks/compose.py`, `tasks/no_such_module.py`, `data/reports/report.{md,html}`, `tasks/steps/*`"
    assert cited_paths(text) == {"tasks/compose.py", "tasks/no_such_module.py"}
    assert missing_paths(text) == ["tasks/no_such_module.py"]
    assert missing_paths("`data/variants/catalogue.parquet` (generated, ignored)") == []


def test_every_path_the_docs_cite_exists() -> None:
    missing = [f"{p.relative_to(ROOT)}: {m}" for p in doc_files() for m in missing_paths(p.read_text("utf-8"))]
    assert missing == []


def test_the_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text("utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES
    assert any(line.startswith("make test") for line in lines)  # CI and newcomers run this line


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or "mkdocs"
    result = subprocess.run(
        [mkdocs, "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "cli" / "index.html").is_file()
