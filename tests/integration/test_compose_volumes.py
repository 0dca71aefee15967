"""What docker compose does with the worker's output folder, simulated without a
Docker engine: the worker runs as the image's user (uid 10001, as root can start
it here) on a folder made the way Docker makes each kind of mount.

- A new named volume (docker-compose.yml's choice) starts as a copy of the image's
  folder, owner and mode included: the Dockerfile's ``mkdir -p /data`` (root,
  umask 022: 0755) then ``chown app:app``. The worker writes records there.
- A bind mount whose host folder is missing is created by the engine as root,
  0755: the worker cannot write it and says so in one line (exit 2)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stream_export.settings import Settings
from tests.support.monitoring import free_port, get
from tests.support.processes import settings_args
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

#: The image's user (Dockerfile: useradd --uid 10001 app; USER 10001).
APP = 10001


@pytest.fixture
def host() -> Iterator[Path]:
    """A folder the image's user can reach (pytest's own tmp folders are 0700)."""
    path = Path(tempfile.mkdtemp(prefix="compose-volumes-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


def named_volume(path: Path) -> Path:
    """A new named volume: a copy of the image's folder (root mkdir, then chown app:app)."""
    path.mkdir(mode=0o755)
    os.chown(path, APP, APP)
    return path


def missing_bind_source(path: Path) -> Path:
    """What the engine creates for a bind mount's missing host folder."""
    path.mkdir(mode=0o755)
    os.chown(path, 0, 0)
    return path


def _hidden_ancestor(path: Path) -> tuple[Path, set[Path]] | None:
    """The first folder on the way to ``path``, itself included, that others cannot
    enter, and what below it the process needs: the next folder on the way or, when
    ``path`` itself is closed (a fresh clone at the root of a 0700 temporary
    folder), its subfolders."""
    chain = [*path.parents[::-1], path]
    for i, folder in enumerate(chain):
        if folder.is_dir() and not folder.stat().st_mode & 0o001:
            if i + 1 < len(chain):
                return folder, {chain[i + 1]}
            return folder, {child for child in folder.iterdir() if child.is_dir()}
    return None


def _needed() -> list[Path]:
    """What the worker's process reads: the interpreter's tree, the virtual
    environment and the project's sources (an editable install)."""
    import stream_export

    return [
        Path(os.path.realpath(sys.executable)),
        Path(sys.prefix),
        Path(stream_export.__file__).resolve().parents[1],
    ]


def as_image_user(hold: Path, *args: str) -> list[str]:
    """``stream-export ARGS`` as uid 10001 with no capabilities (setpriv). Where what
    the process reads sits under a folder closed to others (/root/.pyenv for the
    interpreter, a 0700 temporary folder for a fresh clone), a private mount
    namespace lays an open tmpfs over that folder with the needed trees bound back
    in; nothing else changes for the process."""
    command = [sys.executable, "-m", "stream_export", *args]
    drop = ["setpriv", f"--reuid={APP}", f"--regid={APP}", "--clear-groups", "--inh-caps=-all"]
    closed: dict[Path, set[Path]] = {}
    for path in _needed():
        hidden = _hidden_ancestor(path)
        if hidden is not None:
            closed.setdefault(hidden[0], set()).update(hidden[1])
    if not closed:
        return [*drop, "--", *command]
    hold.mkdir()
    steps, n = ["set -e"], 0
    pairs: list[tuple[Path, Path]] = []
    for children in closed.values():
        for child in sorted(children):
            held = hold / str(n)
            held.mkdir()
            n += 1
            steps.append(f"mount --bind '{child}' '{held}'")
            pairs.append((child, held))
    for folder in closed:
        steps.append(f"mount -t tmpfs -o mode=0755,size=1m tmpfs '{folder}'")
    for child, held in pairs:
        steps.append(f"mkdir -p '{child}'; mount --move '{held}' '{child}'")
    script = "; ".join(steps) + '; exec "$@"'
    return [
        "unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh",
        *drop, "--", *command,
    ]  # fmt: skip


def image_user_env(home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HOME": str(home),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }


def test_the_worker_writes_records_to_a_new_named_volume(
    settings_for: Callable[..., Settings], host: Path
) -> None:
    data, state = named_volume(host / "data"), named_volume(host / "state")
    port = free_port()
    settings = settings_for(
        f"sink.output_dir={data}",
        f"worker.data_dir={state}",
        "worker.store=rocksdb://",
        "http.enabled=true",
        f"http.port={port}",
    )
    log = host / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            as_image_user(host / "hold-worker", "worker", *settings_args(settings)),
            stdout=out,
            stderr=subprocess.STDOUT,
            env=image_user_env(state),
            start_new_session=True,
        )
    try:
        wait_for(
            lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200,
            timeout=90,
            what=f"/readyz 200\n{log.read_text(errors='replace')[-3000:]}",
        )
        subprocess.run(
            [
                sys.executable,
                "-m",
                "stream_export",
                "demo",
                *settings_args(settings),
                "--count",
                "5",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        active = data / f"{settings.sink.prefix}.jsonl"
        wait_for(
            lambda: active.exists() and active.read_bytes().count(b"\n") >= 1,
            timeout=60,
            what=f"a record in {active}\n{log.read_text(errors='replace')[-3000:]}",
        )
    finally:
        worker.terminate()
        worker.wait(30)
    assert worker.returncode == 0, log.read_text(errors="replace")[-3000:]
    assert active.stat().st_uid == APP
    assert any(p.stat().st_uid == APP for p in state.rglob("*"))


def test_a_root_owned_bind_mount_is_one_line_and_exit_2(
    settings_for: Callable[..., Settings], host: Path
) -> None:
    data = missing_bind_source(host / "data")
    settings = settings_for(
        "kafka.bootstrap_servers=127.0.0.1:1",
        f"sink.output_dir={data}",
        f"worker.data_dir={named_volume(host / 'state')}",
    )
    done = subprocess.run(
        as_image_user(host / "hold", "worker", *settings_args(settings)),
        capture_output=True,
        text=True,
        timeout=60,
        env=image_user_env(host / "state"),
    )
    assert (done.returncode, done.stderr.splitlines()) == (
        2,
        [f"stream-export: output_dir: sink.output_dir '{data}' is not writable: Permission denied"],
    )
    assert not list(data.iterdir())
