"""What dev/vllm, dev/litellm, dev/docs and dev/trainers share: a Python environment
apart from the project's, installed exactly from a lock file with uv (byte-compiled)
into a cached folder named by the lock's hash, and the lock resolved from a .in file.
A changed lock builds a new folder and removes the old ones of the same name.
Standard library only (it runs before the project's virtual environment exists).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEV = Path(__file__).resolve().parent
CACHE = DEV / ".cache"


def digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for path in paths:
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def pinned(lock: Path, package: str) -> str:
    """The version ``lock`` pins ``package`` to."""
    for line in lock.read_text().splitlines():
        if line.startswith(f"{package}=="):
            return line.split("==", 1)[1].strip()
    raise SystemExit(f"{package} missing from {lock}")


def env_dir(name: str, lock: Path, package: str) -> Path:
    """dev/.cache/<name>-<version of package>-<hash of the lock>."""
    return CACHE / f"{name}-{pinned(lock, package)}-{digest(lock)}"


def uv() -> str:
    local = DEV.parent / ".venv" / "bin" / "uv"
    found = str(local) if local.exists() else shutil.which("uv")
    if found is None:
        raise SystemExit("uv not found; run dev/setup first (it installs uv in .venv)")
    return found


def run(cmd: list[str], what: str) -> None:
    if subprocess.run(cmd).returncode != 0:
        raise SystemExit(f"{what} failed (see above): {' '.join(cmd)}")


def build(name: str, env: Path, lock: Path, base: str = sys.executable) -> Path:
    """``env``/venv installed from ``lock`` on the interpreter ``base`` unless its
    marker says it is; older folders of ``name`` are removed first. The venv's python."""
    python = env / "venv" / "bin" / "python"
    if (env / ".complete").exists():
        return python
    for old in CACHE.glob(f"{name}-*"):
        shutil.rmtree(old)
    start = time.monotonic()
    print(f"{name} environment: installing {lock.name} into {env}", file=sys.stderr)
    run([uv(), "venv", "-q", "--python", base, str(env / "venv")], "uv venv")
    run(
        [uv(), "pip", "sync", "-q", "--compile-bytecode", "--python", str(python), str(lock)],
        "uv pip sync",
    )
    (env / ".complete").touch()
    print(f"{name} environment: installed in {time.monotonic() - start:.0f}s", file=sys.stderr)
    return python


def compile_lock(
    requirements: Path,
    lock: Path,
    header: str,
    overrides: list[str],
    excludes: list[str],
    python_version: str = "3.11",
) -> None:
    """Resolve ``requirements`` into ``lock`` (CPython ``python_version``, x86_64 Linux),
    headed by ``header`` (comment lines)."""
    with tempfile.TemporaryDirectory() as tmp:
        extra: list[str] = []
        for flag, lines in (("--overrides", overrides), ("--excludes", excludes)):
            if lines:
                path = Path(tmp, flag.strip("-") + ".txt")
                path.write_text("\n".join(lines) + "\n")
                extra += [flag, str(path)]
        platform = ["--python-platform", "x86_64-unknown-linux-gnu"]
        target = ["--python-version", python_version, *platform]
        # --no-config: the project's [tool.uv] settings (its torch override) are its own.
        plain = ["--no-header", "--no-annotate", "--no-config"]
        compile_ = ["pip", "compile", "-q", str(requirements), "-o", str(lock)]
        run([uv(), *compile_, *extra, *target, *plain], "uv pip compile")
    lock.write_text(header + lock.read_text())
    print(f"wrote {lock}")
