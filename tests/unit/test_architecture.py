"""The package layout the README's architecture section describes, checked against the code.

Every module is listed there and names its concept in its docstring; each subpackage
imports only what its row allows, and every package has its place in the import
contracts that `lint-imports` holds (pyproject.toml: the layers, a contract that
imports nothing else, a gateway and feed without the Faust app, pure rules without
Faust, mode or aiohttp); Faust's and aiokafka's private names stay in runtime/patches/.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import stream_export

PACKAGE = Path(stream_export.__file__).parent
ROOT = PACKAGE.parent
README = (ROOT / "README.md").read_text()
#: The entry points may import anything; the other top-level modules (the contract,
#: settings, errors) are shared by every stage and import only each other.
ENTRY = {"cli", "__main__"}
#: Packages every stage shares, as it shares the top-level modules.
SHARED = {"settings", "contract", "rows", "telemetry"}

#: The frameworks whose private names only runtime/patches/ may import.
FRAMEWORKS = ("faust", "mode", "aiohttp")


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else len(README)]


def _table(section: str, header: str) -> list[list[str]]:
    """The rows of the markdown table whose header line starts with ``header``."""
    lines = section.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _ticked(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _modules() -> set[str]:
    """Every module below the package (packages are described by the package table)."""
    return {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")} - {
        p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("__init__.py")
    }


def _subpackages() -> set[str]:
    return {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}


def _imports(path: Path) -> set[str]:
    """Every stream_export module or package a file imports, anywhere in it."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "stream_export":
                found.update(f"stream_export.{alias.name}" for alias in node.names)
            elif node.module.startswith("stream_export."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("stream_export."))
    return found


def test_every_module_is_in_the_readme_and_every_listed_one_exists() -> None:
    listed = {
        name for row in _table(_section("Architecture"), "| module |") for name in _ticked(row[0])
    }
    assert listed == _modules(), (
        f"missing from the README: {sorted(_modules() - listed)}; "
        f"listed but gone: {sorted(listed - _modules())}"
    )


def test_each_subpackage_imports_only_what_its_row_allows() -> None:
    rows = _table(_section("Architecture"), "| package |")
    allowed = {_ticked(row[0])[0].rstrip("/"): set(_ticked(row[2])) for row in rows}
    assert set(allowed) == _subpackages()
    assert all(allowed[p] <= _subpackages() for p in allowed)
    shared = {p.stem for p in PACKAGE.glob("*.py")} - ENTRY - {"__init__"} | SHARED
    problems = []
    for module in sorted(_modules()):
        own = module.split("/")[0] if "/" in module else None
        for target in _imports(PACKAGE / module):
            part = target.split(".")[1]
            if part == "__version__" or part == own or part in shared:
                continue
            ok = module.removesuffix(".py") in ENTRY if own is None else part in allowed[own]
            if not ok:
                problems.append(f"{module} imports {target}")
    assert not problems, "imports the README's package table does not allow:\n" + "\n".join(
        problems
    )


def _layers() -> list[str]:
    """The packages of the import contracts' layers, top to bottom (pyproject.toml)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layers = next(c for c in config["contracts"] if c["type"] == "layers")["layers"]
    return [name.removeprefix("stream_export.") for layer in layers for name in layer.split(" | ")]


def test_the_import_contracts_place_every_package() -> None:
    """lint-imports (run by the test command) holds the layers; a package missing from
    them would be held by nothing."""
    placed = set(_layers())
    expected = _subpackages() | {"cli", "errors"}
    assert placed == expected, f"unplaced: {expected - placed}; gone: {placed - expected}"


def test_private_framework_names_stay_in_the_adapter() -> None:
    """Imports of private framework modules or names happen in runtime/patches/ alone; ruff's
    SLF001 (private attribute access) is waived only there, in the client's one aiokafka
    shutdown, in the metadata refresh pacing (Faust-free: the gateway paces too), and
    in tests and probes that read internals on purpose."""
    ignores = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]["lint"][
        "per-file-ignores"
    ]
    waived = {glob for glob, rules in ignores.items() if "SLF001" in rules}
    assert {g for g in waived if g.startswith("stream_export/")} == {
        "stream_export/{runtime/patches/*,client/producer,kafka/connection}.py"
    }
    for module in sorted(_modules()):
        if module.startswith("runtime/patches/"):
            continue
        for node in ast.walk(ast.parse((PACKAGE / module).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                root = node.module.split(".")[0]
                if root in {*FRAMEWORKS, "aiokafka"}:
                    names = [node.module, *(a.name for a in node.names)]
                    private = [n for n in names if any(p.startswith("_") for p in n.split("."))]
                    assert not private, f"{module} imports private {private}"


def test_every_module_names_its_one_concept() -> None:
    """A module's docstring says what it holds, in its first sentence: the place a
    reader looks to know whether a change belongs there (CONTRIBUTING.md)."""
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        docstring = ast.get_docstring(ast.parse(path.read_text()))
        empty_init = path.name == "__init__.py" and not path.stat().st_size
        if not empty_init and (not docstring or len(docstring.split()) < 4):
            missing.append(path.relative_to(ROOT).as_posix())
    assert not missing, f"modules without a docstring naming their concept: {missing}"
