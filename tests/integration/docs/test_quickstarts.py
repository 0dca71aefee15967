"""Every quickstart page runs as written: its ``<!-- run -->`` blocks, in order, in one
bash script from the repository's root, against the session's broker and vLLM server.

The environment gives the pages' own variables (``KAFKA_BOOTSTRAP_SERVERS``,
``VLLM_URL``, which the pages use instead of starting their own servers) and settings
that keep a run apart from every other test on the same broker and machine: its own
topic names, app id and ports. The pages' commands stay as a reader types them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support.doc_blocks import QUICKSTARTS, ROOT, script
from tests.support.monitoring import free_port
from tests.support.vllm_server import VllmServer

#: Seconds a page may take: each is meant to be followed in five minutes by hand.
PAGE_TIMEOUT_S = 240


def page_env(kafka: str, vllm: str, unique: Callable[[str], str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_EXPORT_")}
    # helm as an operator has it on PATH: dev/setup --dev builds it into dev/.cache.
    helm = [str(p.parent) for p in (ROOT / "dev" / ".cache").glob("helm-v*/bin/helm")]
    return {
        **env,
        "PATH": os.pathsep.join([*helm, env["PATH"]]),
        "KAFKA_BOOTSTRAP_SERVERS": kafka,
        "VLLM_URL": vllm,
        "STREAM_EXPORT_TOPICS_STEPS": unique("steps"),
        "STREAM_EXPORT_TOPICS_EPISODES": unique("episodes"),
        "STREAM_EXPORT_TOPICS_DEAD_LETTERS": unique("dlq"),
        "STREAM_EXPORT_WORKER_APP_ID": unique("app"),
        "STREAM_EXPORT_HTTP_PORT": str(free_port()),
        "STREAM_EXPORT_HTTP_PROBE_PORT": str(free_port()),
        "STREAM_EXPORT_GATEWAY_PORT": str(free_port()),
    }


def run_page(page: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    """The page's script in a process group of its own, which is ended afterwards
    whatever happened (a worker a failed page left in the background, say)."""
    began = time.monotonic()
    proc = subprocess.Popen(
        ["bash", "-c", script(page)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=PAGE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done, time.monotonic() - began


@pytest.mark.parametrize("page", QUICKSTARTS, ids=[p.stem for p in QUICKSTARTS])
def test_the_quickstart_runs_as_written(
    page: Path,
    kafka_bootstrap: str,
    vllm_server: VllmServer,
    unique: Callable[[str], str],
) -> None:
    done, took = run_page(page, page_env(kafka_bootstrap, vllm_server.url, unique))
    assert done.returncode == 0, (
        f"{page.name} failed after {took:.0f}s:\n{done.stdout}\n{done.stderr}"
    )
    expected = {
        "agent-developer": ['"input_ids": [', "Action: try opening the door"],
        "ml-engineer": ["rows in the verl parquet", "2 batches of groups trained on"],
        "operator": ["stream_export_records_written_total", "SUCCESS"],
    }[page.stem]
    for shown in expected:
        assert shown in done.stdout, f"{page.name}: {shown!r} not in its output:\n{done.stdout}"
