"""What we depend on is pinned: bounded requirements in pyproject.toml, the exact
set in uv.lock, installed as locked by dev/setup and by the Dockerfile (checked
as text: there is no Docker engine here), with a small build context."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
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
    differ = {
        name: (version, sorted(locked[name]))
        for name, version in installed.items()
        if name in locked and version not in locked[name]
    }
    assert not differ, f"not the versions in uv.lock (run dev/setup): {differ}"
    # Only uv and pip, which dev/setup uses to install the lock, come from elsewhere.
    extra = set(installed) - set(locked) - {"uv", "pip"}
    assert not extra, f"installed but not in uv.lock (run dev/setup): {sorted(extra)}"
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


def _stages() -> list[tuple[str, list[tuple[str, str]]]]:
    """(FROM arguments, steps) of each build stage."""
    stages: list[tuple[str, list[tuple[str, str]]]] = []
    for ins, args in _dockerfile():
        if ins == "FROM":
            stages.append((args, []))
        elif stages:
            stages[-1][1].append((ins, args))
    return stages


def _stage(name: str | None) -> list[tuple[str, str]]:
    """The steps of the stage named ``name`` (None: the final, unnamed one)."""
    (steps,) = [
        steps
        for base, steps in _stages()
        if (base.split(" AS ")[1] if " AS " in base else None) == name
    ]
    return steps


def test_the_base_image_is_an_exact_release_used_by_every_stage() -> None:
    steps = _dockerfile()
    (default,) = [a.split("=", 1)[1] for i, a in steps if i == "ARG" and a.startswith("PYTHON_")]
    # The tag policy (see the Dockerfile): an exact Python patch release on a named
    # Debian release, optionally with its digest; never a floating tag.
    assert re.fullmatch(r"python:3\.11\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", default), default
    versions = dict(
        line.split("=", 1) for line in (ROOT / "dev" / "versions.env").read_text().splitlines()
    )
    assert versions["PYTHON_IMAGE"] == default  # docker compose passes this one
    assert {base.split()[0] for base, _ in _stages()} == {"${PYTHON_IMAGE}"}
    assert Requirement(f"python{_pyproject()['project']['requires-python']}").specifier.contains(
        default.split(":")[1].split("-")[0]
    )


def test_the_image_installs_the_lock_before_it_copies_the_sources() -> None:
    lock = _stage("lock")
    copy_lock, _ = _find(lock, "COPY", r"\buv\.lock\b")
    export, _ = _find(lock, "RUN", r"uv export .*--frozen")
    exported = re.findall(
        r"--frozen --no-emit-project (--only-group build )?.*?-o (\S+)", lock[export][1]
    )
    assert copy_lock < export and [g for g, _ in exported] == ["", "--only-group build "]
    (runtime, build) = [path for _, path in exported]

    final = _stage(None)
    carry, (source, target) = _find(final, "COPY", r"--from=lock (\S+) (\S+)")
    install_locked, (installed,) = _find(
        final, "RUN", r"pip install .*--no-deps --require-hashes -r (\S+)"
    )
    wheel, _ = _find(final, "COPY", r"--from=wheel ")
    install_project, _ = _find(final, "RUN", r"pip install .*--no-deps --no-index \S+\.whl")
    assert (source, target) == (runtime, installed)
    assert carry < install_locked < wheel < install_project
    assert not [a for i, a in final if i == "COPY" and "--from=" not in a], "sources in the image"

    stage = _stage("wheel")
    _, (from_lock, _) = _find(stage, "COPY", r"--from=lock (\S+) (\S+)")
    assert from_lock == build
    install_backend, _ = _find(stage, "RUN", r"pip install .*--no-deps --require-hashes -r ")
    sources, _ = _find(stage, "COPY", r"^stream_export ")
    build_wheel, _ = _find(stage, "RUN", r"pip wheel .*--no-deps --no-build-isolation")
    assert install_backend < sources < build_wheel


def test_the_locked_build_backend_is_the_build_system() -> None:
    data = _pyproject()
    assert data["dependency-groups"]["build"] == data["build-system"]["requires"]


def test_the_dockerfile_is_hadolint_clean() -> None:
    hadolint = Path(sys.executable).with_name("hadolint")
    assert hadolint.exists(), "hadolint is missing: run dev/setup --dev"
    done = subprocess.run(
        [str(hadolint), "--no-color", "Dockerfile"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


#: The wheel stage's command (the Dockerfile's, less its cache flag).
PIP_WHEEL = ["pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]


def _wheel_sources() -> list[str]:
    """What the Dockerfile's wheel stage copies from the build context, each to the
    same name in its build folder."""
    sources = []
    for ins, args in _stage("wheel"):
        if ins == "COPY" and not args.startswith("--from="):
            *names, target = args.split()
            assert target in {"./", f"./{names[0]}"}, args
            sources += names
    return sources


def _wheel(workdir: Path, epoch: str = "315532800", mtime: int = 1_000_000_000) -> Path:
    """The wheel built as the Dockerfile's wheel stage does, from a copy of what it
    copies whose files all have the time stamp ``mtime``."""
    src = workdir / "src"
    src.mkdir(parents=True)
    for name in _wheel_sources():
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, src / name)
    for path in src.rglob("*"):
        os.utime(path, (mtime, mtime))
    subprocess.run(
        [sys.executable, "-m", *PIP_WHEEL, "--wheel-dir", str(workdir / "dist"), "."],
        cwd=src,
        env={**os.environ, "SOURCE_DATE_EPOCH": epoch, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
        check=True,
        capture_output=True,
        timeout=120,
    )
    (wheel,) = (workdir / "dist").glob("stream_export-*.whl")
    return wheel


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_wheel_in_the_image_is_the_same_in_every_build(tmp_path: Path) -> None:
    (epoch,) = [a.split("=", 1)[1] for i, a in _stage("wheel") if i == "ARG"]
    wheel = [a for i, a in _stage("wheel") if i == "RUN" and a.startswith("pip wheel")]
    assert wheel and all(flag in wheel[0].split() for flag in ("--no-deps", "--no-build-isolation"))
    one, two = _wheel(tmp_path / "one", epoch), _wheel(tmp_path / "two", epoch, 1_700_000_000)
    assert _sha256(one) == _sha256(two)


#: What a user of the wheel writes: an agent on the client's recorders, a trainer on
#: the feed.
USER_CODE = """
from stream_export.client import Producer, SyncProducer
from stream_export.feed import Feed


async def agent() -> None:
    async with Producer("127.0.0.1:9092") as producer:
        reveal_type(producer)
        async with producer.episode(agent_id="a", prompt="p") as episode:
            reveal_type(episode)
            reveal_type(episode.thought("looking around"))


def sync_agent() -> None:
    with SyncProducer("127.0.0.1:9092") as producer:
        with producer.episode(agent_id="a", prompt="p") as episode:
            reveal_type(episode)


def trainer(feed: Feed) -> None:
    reveal_type(feed.next_batch(timeout_s=1.0))
"""
#: What a type checker must see in it, in order.
REVEALED = [
    r"stream_export\.[\w.]+\.Producer",
    r"stream_export\.[\w.]+\.EpisodeRecorder",
    r"typing\.(Awaitable|Coroutine)\[.*None\]",
    r"stream_export\.[\w.]+\.SyncEpisodeRecorder",
    r"stream_export\.[\w.]+\.Batch",
]


def test_the_wheel_carries_the_license_and_its_types(tmp_path: Path) -> None:
    with zipfile.ZipFile(_wheel(tmp_path / "build")) as wheel:
        names = set(wheel.namelist())
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        fields = wheel.read(metadata).decode().split("\n\n", 1)[0].splitlines()
        license_file = wheel.read(metadata.replace("METADATA", "licenses/LICENSE"))
        wheel.extractall(tmp_path / "site")
    assert "stream_export/py.typed" in names
    assert license_file == (ROOT / "LICENSE").read_bytes()
    assert license_file.startswith(b"MIT License\n")
    assert {"License-Expression: MIT", "License-File: LICENSE"} <= set(fields)
    assert _pyproject()["project"]["license"] == "MIT"

    # A user's type checker on code that imports the installed wheel (and its
    # dependencies), never this checkout: a bare interpreter that finds only those.
    python = tmp_path / "venv" / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(python.parents[1])],
        check=True,
        timeout=120,
    )
    user = tmp_path / "user"
    user.mkdir()
    (user / "agent.py").write_text(USER_CODE)
    (user / "mypy.ini").write_text("[mypy]\nstrict = True\n")
    found = os.pathsep.join([str(tmp_path / "site"), sysconfig.get_paths()["purelib"]])
    mypy = [str(Path(sys.executable).with_name("mypy")), "--python-executable", str(python)]
    done = subprocess.run(
        [*mypy, "--config-file", "mypy.ini", "--cache-dir", str(tmp_path / "cache"), "agent.py"],
        cwd=user,
        env={**os.environ, "PYTHONPATH": found},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    revealed = re.findall(r'Revealed type is "(.+)"', done.stdout)
    assert len(revealed) == len(REVEALED), done.stdout
    for seen, wanted in zip(revealed, REVEALED, strict=True):
        assert re.fullmatch(wanted, seen) and "Any" not in seen, done.stdout


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
    for kept in (
        "pyproject.toml",
        "uv.lock",
        "README.md",
        "LICENSE",
        "stream_export/cli.py",
        "topics",
    ):
        assert any(path == kept or path.startswith(f"{kept}/") for path in context), kept
    for left_out in (".git", ".venv", "dev/.cache", "dev/.kafka", ".mypy_cache", ".pytest_cache"):
        assert not any(p == left_out or p.startswith(f"{left_out}/") for p in context), left_out
    assert not [p for p in context if "__pycache__" in p or p.endswith(".pyc")]
    assert sum(context.values()) < 10 * 2**20, sorted(context, key=context.__getitem__)[-5:]
