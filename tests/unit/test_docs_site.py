"""The documentation site's toolchain (dev/docs, its environment locked in dev/docs.lock):
MkDocs with the Material theme builds the site in strict mode, a broken link fails the
build, and Vale with the house style (docs/.vale/styles/StreamExport, .vale.ini) passes
the docs and catches what the style forbids."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import dev_tool

ROOT = Path(__file__).resolve().parents[2]
#: 45 words in one sentence: over the style's hard limit of 40.
LONG = " ".join(["word"] * 44) + " end."


@pytest.fixture(scope="module")
def tools() -> dict[str, str]:
    """Paths of the built toolchain; fails saying how to build it when missing."""
    found = dev_tool("docs", "paths", timeout=60)
    if found.returncode != 0:
        pytest.fail(found.stderr, pytrace=False)
    paths: dict[str, str] = json.loads(found.stdout)
    return paths


def vale(tools: dict[str, str], *targets: Path | str) -> dict[str, list[dict[str, Any]]]:
    """Vale's findings per file (JSON output) with the repository's configuration."""
    ran = subprocess.run(
        [tools["vale"], f"--config={tools['vale_config']}", "--output=JSON", *map(str, targets)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert ran.returncode in (0, 1), ran.stderr  # 1: an error-level finding
    findings: dict[str, list[dict[str, Any]]] = json.loads(ran.stdout or "{}")
    return findings


def test_the_site_builds_in_strict_mode(tools: dict[str, str], tmp_path: Path) -> None:
    built = dev_tool("docs", "build", str(tmp_path / "site"), timeout=180)
    assert built.returncode == 0, built.stderr
    page = (tmp_path / "site" / "index.html").read_text()
    assert "<title>stream-export</title>" in page
    assert "md-header" in page  # the Material theme
    assert "Agents publish one Kafka message per step" in page  # docs/index.md


def test_a_broken_link_fails_the_build(tools: dict[str, str], tmp_path: Path) -> None:
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    with (tmp_path / "docs" / "index.md").open("a") as page:
        page.write("\nSee [the missing page](missing.md).\n")
    args = ["build", str(tmp_path / "site"), "--config-file", str(tmp_path / "mkdocs.yml")]
    built = dev_tool("docs", *args, timeout=180)
    assert built.returncode != 0
    assert "contains a link 'missing.md', but the target is not found" in built.stderr
    assert "Aborted with 1 warnings in strict mode" in built.stdout + built.stderr


def test_the_docs_and_the_readme_pass_the_prose_linter(tools: dict[str, str]) -> None:
    found = vale(tools, "docs", "README.md")
    errors = [
        f"{page}:{f['Line']} {f['Check']}"
        for page, findings in found.items()
        for f in findings
        if f["Severity"] == "error"
    ]
    assert errors == []
    linted = dev_tool("docs", "lint", timeout=120)  # docs/ and README.md
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_the_linter_catches_what_the_house_style_forbids(
    tools: dict[str, str], tmp_path: Path
) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "# A page\n\n"
        f"{LONG}\n\n"
        "This used to fail, see issue #12.\n\n"
        "The key is used to sign requests. Start kafka first.\n"
    )
    found = {(f["Line"], f["Check"], f["Severity"]) for f in vale(tools, page)[str(page)]}
    assert found == {
        (3, "StreamExport.SentenceLength", "warning"),
        (3, "StreamExport.SentenceLengthMax", "error"),
        (5, "StreamExport.History", "error"),  # "used to", past
        (7, "StreamExport.Names", "error"),  # "kafka"; "is used to sign" is a purpose
    }
    assert dev_tool("docs", "lint", str(page), timeout=120).returncode == 1
