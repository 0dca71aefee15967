"""Code blocks of the docs site that a test runs: a block marked ``<!-- run -->`` is
executed as written, in page order, by tests/integration/docs/test_quickstarts.py; a
block marked ``<!-- not run: REASON -->`` names why it cannot run here and which test
holds it instead. A quickstart page has no block without one of the two marks."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
QUICKSTARTS = sorted((DOCS / "quickstart").glob("*.md"))
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```$", re.S | re.M)
MARK = re.compile(r"<!-- (run|not run: (?P<why>[^>]+?)) -->\n$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    code: str
    run: bool
    why: str | None


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, with its mark (or none: ``run`` False, ``why`` None)."""
    text = page.read_text()
    found = []
    for fence in FENCE.finditer(text):
        before = text[: fence.start()]
        mark = MARK.search(before)
        line = before.count("\n") + 1
        run = bool(mark and mark.group(1) == "run")
        why = mark.group("why") if mark else None
        found.append(Block(page, line, fence.group(1), fence.group(2), run, why))
    return found


def script(page: Path) -> str:
    """The page's runnable blocks as one bash script that stops at the first failure."""
    runnable = [b for b in blocks(page) if b.run]
    assert runnable and all(b.language == "sh" for b in runnable), page
    parts = [f"# {page.name}:{b.line}\n{b.code}" for b in runnable]
    return "set -euo pipefail\n" + "\n".join(parts)
