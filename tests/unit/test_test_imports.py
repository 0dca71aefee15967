"""The tests own their helpers (tests/support/): no file under tests/ imports the
benchmarks, which may import the tests' helpers instead, and no test or benchmark
file imports a test module, so that one test file's helpers cannot break another's."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
BENCH = TESTS.parent / "bench"
#: The packages of test modules: a helper two of them share belongs in tests/support/.
TEST_PACKAGES = ("tests.unit", "tests.integration")


def bench_imports(source: str) -> list[str]:
    """The ``bench`` modules that ``source`` imports, as written."""
    return imports_under(source, ("bench",))


def imported_test_modules(source: str) -> list[str]:
    """The test modules (or their packages) that ``source`` imports, as written."""
    return imports_under(source, TEST_PACKAGES)


def imports_under(source: str, packages: tuple[str, ...]) -> list[str]:
    """The modules in ``packages`` (or the packages themselves) that ``source`` imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
        else:
            continue
        found += [m for m in modules if any(m == p or m.startswith(p + ".") for p in packages)]
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


def test_the_check_sees_every_form_of_test_module_import() -> None:
    unit, integration = TEST_PACKAGES  # spelled apart: a grep for such imports skips this
    source = f"from {unit}.test_card import lines\nfrom {integration} import test_gateway\n"
    source += f"import {unit}.test_formats as formats\n"
    source += f"def f() -> None:\n    from {integration}.test_export import export\n"
    source += f"from tests.support.golden import run\nfrom {unit}y import x\nimport tests\n"
    assert imported_test_modules(source) == [
        f"{unit}.test_card",
        integration,
        f"{unit}.test_formats",
        f"{integration}.test_export",
    ]


def test_no_test_or_benchmark_file_imports_a_test_module() -> None:
    files = sorted([*TESTS.rglob("*.py"), *BENCH.rglob("*.py")])
    assert len([f for f in files if f.is_relative_to(BENCH)]) > 10  # the walk found bench
    offenders = {
        str(path.relative_to(TESTS.parent)): found
        for path in files
        if (found := imported_test_modules(path.read_text()))
    }
    assert not offenders, f"test modules imported (move the helper to tests/support/): {offenders}"
