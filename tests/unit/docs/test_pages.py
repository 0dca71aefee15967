"""The README is a front page of at most 200 lines whose links resolve, and every code
block on a quickstart page is either run by the quickstart test or says why not."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.doc_blocks import QUICKSTARTS, ROOT, blocks

README = ROOT / "README.md"


def test_the_readme_is_at_most_200_lines() -> None:
    assert len(README.read_text().splitlines()) <= 200


def test_the_readme_links_resolve() -> None:
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    local = [t for t in targets if "://" not in t]
    assert local, "the README links no page"
    assert [t for t in local if not (ROOT / t).exists()] == []


def test_the_readme_links_a_quickstart_per_user() -> None:
    text = README.read_text()
    for page in QUICKSTARTS:
        assert f"]({page.relative_to(ROOT).as_posix()})" in text, page.name


@pytest.mark.parametrize("page", QUICKSTARTS, ids=[p.stem for p in QUICKSTARTS])
def test_every_quickstart_block_is_run_or_says_why_not(page: Path) -> None:
    found = blocks(page)
    unmarked = [b.line for b in found if not b.run and not b.why]
    assert unmarked == [], f"{page.name}: blocks at lines {unmarked} have no run mark"
    assert sum(b.run for b in found) >= 3
    for block in found:
        if block.why:
            assert "tests/" in block.why, f"{page.name}:{block.line}: name the test that holds it"
