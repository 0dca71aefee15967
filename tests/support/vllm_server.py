"""The real vLLM test server (dev/vllm: CPU, a tiny random model served as `tiny`) for
a test session: started once, warmed up, stopped at the end; or the one at
TEST_VLLM_URL, which must serve the model `dev/vllm setup` builds.
Registered as a plugin in tests/conftest.py (fixture `vllm_server`)."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stream_export.weights import vllm
from tests.support.processes import DEV, dev_tool

URL_ENV = "TEST_VLLM_URL"
#: A running vLLM in dev mode for the tests that reload its weights (never the shared
#: one at TEST_VLLM_URL: they change its weights).
DEV_URL_ENV = "TEST_VLLM_DEV_URL"
HOW_TO = (
    "The vLLM tests need dev/vllm's environment (6 GB, about a minute from empty caches): "
    "run `dev/vllm setup` (dev/setup --dev does it too). To use a running server "
    f"instead, `dev/vllm start` and export {URL_ENV}=$(dev/vllm status)."
)

Json = dict[str, Any]
#: A tool whose arguments the tiny model fills in a few tokens (named or required
#: tool choice; enum and bounds keep it short).
WEATHER: Json = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["paris", "oslo", "lima"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}


@dataclass(frozen=True)
class VllmServer:
    """A running server and the build it serves (for the transformers reference)."""

    url: str
    model: str
    python: Path
    model_dir: Path
    builder: Path
    #: A command that restarts it at the same URL (dev-mode servers only).
    restart: tuple[str, ...] = ()

    def post(self, path: str, body: Json, timeout: float = 120.0) -> Json:
        """POST ``body`` as JSON; the decoded answer, or a failure showing vLLM's error."""
        try:
            with urllib.request.urlopen(self._request(path, body), timeout=timeout) as answer:
                decoded: Json = json.load(answer)
        except urllib.error.HTTPError as error:
            raise AssertionError(f"{path} answered {error.code}: {error.read()!r}") from error
        return decoded

    def stream(self, path: str, body: Json, timeout: float = 120.0) -> list[Json]:
        """POST with ``stream: true``; the server-sent chunks up to ``[DONE]``."""
        chunks: list[Json] = []
        request = self._request(path, {**body, "stream": True})
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            for raw in answer:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    return chunks
                chunks.append(json.loads(line.removeprefix("data: ")))
        raise AssertionError(f"{path}: the stream ended without [DONE] after {chunks}")

    def reference_logprobs(self, calls: list[tuple[list[int], list[int]]]) -> list[list[float]]:
        """Per (prompt ids, completion ids): transformers' fp32 log-probability of each
        completion token under the same model, computed in the vLLM environment."""
        asks = [{"prompt_ids": p, "completion_ids": c} for p, c in calls]
        done = subprocess.run(
            [str(self.python), str(self.builder), "logprobs", str(self.model_dir)],
            input=json.dumps(asks),
            capture_output=True,
            text=True,
            timeout=240,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        )
        assert done.returncode == 0, done.stderr
        scores: list[list[float]] = json.loads(done.stdout)
        return scores

    def _request(self, path: str, body: Json) -> urllib.request.Request:
        return urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )


def dev_vllm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return dev_tool("vllm", *args, env=env, timeout=300)


def warm_up(server: VllmServer) -> None:
    """Pay the first logprobs request's one-off cost (seconds) outside the tests."""
    server.post(
        "/v1/chat/completions",
        {
            "model": server.model,
            "messages": [{"role": "user", "content": "warm up"}],
            "max_tokens": 2,
            "logprobs": True,
        },
    )
    server.post("/v1/completions", {"model": server.model, "prompt": "warm", "max_tokens": 2})


def restart_command(state: Path, *start: str) -> tuple[str, ...]:
    """``dev/vllm stop`` then ``dev/vllm start *start`` of the server whose state is in
    ``state`` (it keeps its port)."""
    tool = f"{shlex.quote(sys.executable)} {shlex.quote(str(DEV / 'vllm'))}"
    script = f"{tool} stop && {tool} start {' '.join(start)}"
    return ("env", f"VLLM_STATE_DIR={state}", "sh", "-c", script)


def _session_vllm(
    tmp_path_factory: pytest.TempPathFactory, url_env: str, *start: str
) -> Iterator[VllmServer]:
    """The vLLM at ``url_env`` if set (dev/vllm's, with VLLM_STATE_DIR as in this
    environment), else one started with ``dev/vllm start *start`` for the session
    (stopped at its end)."""
    found = dev_vllm("paths")
    if found.returncode != 0:
        pytest.fail(f"{HOW_TO}\n\n{found.stderr}", pytrace=False)
    build = json.loads(found.stdout)

    def server(url: str, state: Path) -> VllmServer:
        return VllmServer(
            url.rstrip("/"),
            build["served_name"],
            Path(build["python"]),
            Path(build["model"]),
            Path(build["builder"]),
            restart_command(state, *start) if "--dev" in start else (),
        )

    given = os.environ.get(url_env)
    if given:
        state = Path(os.environ.get("VLLM_STATE_DIR", DEV / ".vllm")).resolve()
        warm_up(server(given, state))
        yield server(given, state)
        return
    state = tmp_path_factory.mktemp("vllm")
    env = {**os.environ, "VLLM_STATE_DIR": str(state)}
    started = dev_vllm("start", *start, env=env)
    if started.returncode != 0:
        log = (state / "server.log").read_text(errors="replace")[-4000:]
        command = " ".join(("dev/vllm start", *start))
        pytest.fail(f"{command} failed:\n{started.stderr}\n{log}\n\n{HOW_TO}", pytrace=False)
    try:
        running = server(dev_vllm("status", env=env).stdout.strip(), state)
        warm_up(running)
        yield running
    finally:
        dev_vllm("stop", env=env)


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """The vLLM test server for the whole session."""
    yield from _session_vllm(tmp_path_factory, URL_ENV)


@pytest.fixture(scope="session")
def dev_mode_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """A vLLM of the session's own in dev mode (its weights can be reloaded), started
    once for every test that changes weights (the weight fence's, the live loop's);
    or the one at TEST_VLLM_DEV_URL."""
    yield from _session_vllm(tmp_path_factory, DEV_URL_ENV, "--dev")


@pytest.fixture
def reloadable_vllm(dev_mode_vllm: VllmServer) -> VllmServer:
    """The session's dev-mode vLLM serving the tiny model's own weights: a test before
    may have loaded others (the fence's, the live loop's), so each starts from these."""
    loaded = asyncio.run(vllm.load(dev_mode_vllm.url, dev_mode_vllm.model_dir, "original"))
    assert "reload" in loaded.seconds
    return dev_mode_vllm
