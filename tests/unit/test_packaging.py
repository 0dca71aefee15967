"""What we depend on is pinned: bounded requirements in pyproject.toml, the exact
set in uv.lock, installed as locked by dev/setup and by the Dockerfile (checked
as text: there is no Docker engine here), with a small build context."""

from __future__ import annotations

import importlib.metadata
import os
import re
import tomllib
from collections import defaultdict
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
# The worker relies on their internals, which change between minor releases.
ONE_MINOR = {"faust-streaming", "mode-streaming", "aiokafka"}


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirements() -> list[Requirement]:
    data = _pyproject()
    groups = [
        data["build-system"]["requires"],
        data["project"]["dependencies"],
        *data["project"]["optional-dependencies"].values(),
    ]
    return [Requirement(text) for group in groups for text in group]


def _floor(req: Requirement) -> Version:
    (floor,) = (Version(s.version) for s in req.specifier if s.operator == ">=")
    return floor


def _next(version: Version, *, minor: bool) -> Version:
    """The next minor release, or the next major one (the next minor for 0.x)."""
    major, minor_part = version.release[:2]
    return Version(f"{major}.{minor_part + 1}" if minor or major == 0 else f"{major + 1}")


def _assert_bounds(req: Requirement, ceiling: Version) -> None:
    assert req.specifier.contains(_floor(req), prereleases=True), req
    assert not req.specifier.contains(ceiling, prereleases=True), (
        f"{req}: needs an upper bound at most {ceiling}"
    )


def test_every_dependency_has_an_upper_bound_at_the_next_major() -> None:
    for req in _requirements():
        _assert_bounds(req, _next(_floor(req), minor=False))


def test_faust_mode_and_aiokafka_are_bounded_to_one_minor_version() -> None:
    found = {str(canonicalize_name(r.name)): r for r in _requirements()}
    for name in ONE_MINOR:
        _assert_bounds(found[name], _next(_floor(found[name]), minor=True))


def _locked() -> dict[str, set[str]]:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    versions: dict[str, set[str]] = defaultdict(set)
    for package in lock["package"]:
        versions[canonicalize_name(package["name"])].add(package["version"])
    return versions


def test_the_installed_packages_are_the_locked_versions() -> None:
    locked = _locked()
    assert locked["faust-streaming"] == {"0.15.3"} and locked["aiokafka"] == {"0.14.0"}
    installed = {
        canonicalize_name(dist.metadata["Name"]): dist.version
        for dist in importlib.metadata.distributions()
    }
    # uv, pip and setuptools come with the virtual environment, not from the lock.
    differ = {
        name: (version, sorted(locked[name]))
        for name, version in installed.items()
        if name in locked and version not in locked[name]
    }
    assert not differ, f"not the versions in uv.lock (run dev/setup): {differ}"
    assert {"faust-streaming", "aiokafka", "pytest", "mypy"} <= set(installed)


def _uv_range(text: str) -> str:
    (spec,) = re.findall(r'"uv(>=[^"]+)"', text)
    return str(spec)


def test_setup_and_the_image_install_the_uv_that_writes_the_lock() -> None:
    wanted = _pyproject()["tool"]["uv"]["required-version"]
    assert not Requirement(f"uv{wanted}").specifier.contains("0.14")
    for name in ("dev/setup", "Dockerfile"):
        assert _uv_range((ROOT / name).read_text()) == wanted, name


def _dockerfile() -> list[tuple[str, str]]:
    """(instruction, arguments) of each Dockerfile line, continuations joined."""
    text = re.sub(r"\s*\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    lines = (line.strip() for line in text.splitlines())
    return [
        (word.upper(), rest.strip())
        for word, _, rest in (line.partition(" ") for line in lines if line and line[0] != "#")
    ]


def _find(steps: list[tuple[str, str]], instruction: str, pattern: str) -> tuple[int, list[str]]:
    """Position of the one step that matches, and the pattern's groups."""
    (found,) = [
        (i, list(m.groups()))
        for i, (ins, args) in enumerate(steps)
        if ins == instruction and (m := re.search(pattern, args))
    ]
    return found


def test_the_image_installs_the_lock_before_it_copies_the_sources() -> None:
    steps = _dockerfile()
    copy_lock, _ = _find(steps, "COPY", r"\buv\.lock\b")
    export, (exported,) = _find(steps, "RUN", r"uv export .*--frozen.* -o (\S+)")
    carry, (source, target) = _find(steps, "COPY", r"--from=lock (\S+) (\S+)")
    install_locked, (installed,) = _find(
        steps, "RUN", r"pip install .*--no-deps --require-hashes -r (\S+)"
    )
    sources, _ = _find(steps, "COPY", r"^stream_export ")
    install_project, _ = _find(steps, "RUN", r"pip install .*--no-deps \.( |$)")
    assert (source, target) == (exported, installed)
    assert copy_lock < export < carry < install_locked < sources < install_project


def _patterns() -> list[re.Pattern[str]]:
    """.dockerignore lines as regular expressions (Go's filepath.Match plus **)."""
    out = []
    for line in (ROOT / ".dockerignore").read_text().splitlines():
        line = line.strip().lstrip("/")
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("!"), "exceptions are not modelled here"
        parts = re.split(r"(\*\*/|\*\*|\*|\?)", line)
        wild = {"**/": "(.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}
        out.append(re.compile("".join(wild.get(p, re.escape(p)) for p in parts)))
    return out


def _build_context() -> dict[str, int]:
    """Relative path -> size of each file Docker would send, pruning ignored folders."""
    patterns = _patterns()

    def ignored(rel: str) -> bool:
        return any(p.fullmatch(rel) for p in patterns)

    files: dict[str, int] = {}
    for folder, dirs, names in os.walk(ROOT):
        base = Path(folder).relative_to(ROOT)
        dirs[:] = [d for d in dirs if not ignored((base / d).as_posix())]
        for name in names + [d for d in dirs if (Path(folder) / d).is_symlink()]:
            rel = (base / name).as_posix()
            if not ignored(rel):
                files[rel] = (Path(folder) / name).lstat().st_size
    return files


def test_the_build_context_is_the_sources_only() -> None:
    context = _build_context()
    for kept in ("pyproject.toml", "uv.lock", "README.md", "stream_export/cli.py", "topics"):
        assert any(path == kept or path.startswith(f"{kept}/") for path in context), kept
    for left_out in (".git", ".venv", "dev/.cache", "dev/.kafka", ".mypy_cache", ".pytest_cache"):
        assert not any(p == left_out or p.startswith(f"{left_out}/") for p in context), left_out
    assert not [p for p in context if "__pycache__" in p or p.endswith(".pyc")]
    assert sum(context.values()) < 10 * 2**20, sorted(context, key=context.__getitem__)[-5:]
