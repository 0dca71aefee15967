"""The tests own their helpers (tests/support/): no file under tests/ imports the
benchmarks, which may import the tests' helpers instead."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def bench_imports(source: str) -> list[str]:
    """The ``bench`` modules that ``source`` imports, as written."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        found += [m for m in modules if m == "bench" or m.startswith("bench.")]
    return found


def test_the_check_sees_every_form_of_import() -> None:
    source = "import bench\nimport os, bench.report as r\nfrom bench.load import pad\n"
    source += "def f() -> None:\n    from bench import systems\n"
    source += "import benchmarks\nfrom tests.support import bench_like\n"
    assert bench_imports(source) == ["bench", "bench.report", "bench.load", "bench"]


def test_no_test_file_imports_bench() -> None:
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 50  # the walk found the suite
    offenders = {
        str(path.relative_to(TESTS.parent)): found
        for path in files
        if (found := bench_imports(path.read_text()))
    }
    assert not offenders, f"tests import bench (move the helper to tests/support/): {offenders}"
