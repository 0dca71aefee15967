"""A vLLM of the weight tests' own (dev mode: its weights can be reloaded), started
once per session: the tests change its weights, so they never touch the shared one."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.vllm_server import HOW_TO, VllmServer, dev_vllm, warm_up


@pytest.fixture(scope="session")
def reloadable_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    found = dev_vllm("paths")
    if found.returncode != 0:
        pytest.fail(f"{HOW_TO}\n\n{found.stderr}", pytrace=False)
    build = json.loads(found.stdout)
    state = tmp_path_factory.mktemp("reloadable-vllm")
    env = {**os.environ, "VLLM_STATE_DIR": str(state)}
    started = dev_vllm("start", "--dev", env=env)
    if started.returncode != 0:
        log = (state / "server.log").read_text(errors="replace")[-4000:]
        pytest.fail(f"dev/vllm start --dev failed:\n{started.stderr}\n{log}", pytrace=False)
    try:
        server = VllmServer(
            dev_vllm("status", env=env).stdout.strip(),
            build["served_name"],
            Path(build["python"]),
            Path(build["model"]),
            Path(build["builder"]),
        )
        warm_up(server)
        yield server
    finally:
        dev_vllm("stop", env=env)
