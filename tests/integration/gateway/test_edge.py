"""The gateway's HTTP edge against hostile clients, with real parts (the gateway as
its own process, the real broker, the real vLLM; loopback only): slow connections
cut off, request bodies bounded before the upstream is asked, episodes owned by
the client key that started them, browsers' requests (CSRF, DNS rebinding) refused,
nothing internal shown, quotas, and no keyless gateway beyond loopback."""

from __future__ import annotations

import json
import select
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import OpenAI

from stream_export.contract.events import Step
from stream_export.settings import Settings
from tests.support.gateway_agent import (
    assert_vllm_sampled_what_was_recorded,
    base,
    events_of,
    gateway_for,
    metric,
    post,
    reaches,
    running,
)
from tests.support.monitoring import free_port, get
from tests.support.processes import settings_args
from tests.support.upstream_recorder import recording
from tests.support.vllm_server import VllmServer
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration
__all__ = ["gateway_for"]  # the fixture, shared

Json = dict[str, Any]
#: The gateway's process at a low open-files limit (soft 96, hard 128).
LOW_FILES = "import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, (96, 128))"


def request(
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Json, dict[str, str]]:
    """(status, decoded body, headers) of a GET, or of a POST of ``body`` as JSON
    unless ``headers`` say otherwise."""
    sent = {"Content-Type": "application/json", **(headers or {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, sent), timeout=60) as ok:
            return ok.status, json.load(ok), dict(ok.headers)
    except urllib.error.HTTPError as failed:
        return failed.code, json.loads(failed.read() or b"{}"), dict(failed.headers)


def code(answer: tuple[int, Json, dict[str, str]]) -> tuple[int, str]:
    """(status, the error's code) of an error answer."""
    return answer[0], answer[1]["error"]["code"]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def chat(size: int = 0, **more: Any) -> Json:
    """A chat call's body; with ``size``, a user message of that many characters."""
    content = "x" * size if size else "Say hi."
    return {"model": "tiny", "messages": [{"role": "user", "content": content}], **more}


class Trickle:
    """``count`` raw connections to the gateway that send ``head``, then one more
    byte every half second from a thread, until the block ends; what each got back
    and whether the gateway closed it."""

    def __init__(self, port: int, count: int, head: bytes) -> None:
        self.sockets: list[socket.socket] = []
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            s.sendall(head)
            self.sockets.append(s)
        self.received = {s: b"" for s in self.sockets}
        self.closed: set[socket.socket] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drip, daemon=True)
        self._thread.start()

    def _drip(self) -> None:
        while not self._stop.wait(0.5):
            for s in self.sockets:
                try:
                    s.send(b"x")
                except OSError:
                    continue  # closed by the gateway: all_closed() sees it

    def all_closed(self) -> bool:
        """Read what arrived; whether the gateway closed every connection."""
        waiting = [s for s in self.sockets if s not in self.closed]
        readable, _, _ = select.select(waiting, [], [], 0) if waiting else ([], [], [])
        for s in readable:
            try:
                data = s.recv(65536)
            except OSError:
                data = b""
            self.received[s] += data
            if not data:
                self.closed.add(s)
        return len(self.closed) == len(self.sockets)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for s in self.sockets:
            s.close()


@contextmanager
def trickling(port: int, count: int, head: bytes) -> Iterator[Trickle]:
    slow = Trickle(port, count, head)
    try:
        yield slow
    finally:
        slow.stop()


def open_files(pid: int) -> tuple[int, int]:
    """The soft and hard open-files limits of a process."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-files limit")


def test_slow_clients_are_cut_off_and_do_not_shut_others_out(
    gateway_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """200 connections that trickle their headers at a gateway with 128 open files
    (the issue's 1,100 at 1,024, scaled down): each is closed after
    gateway.header_timeout_s, and a fresh client is answered meanwhile. A body that
    trickles is answered 408 after gateway.body_timeout_s and its connection closed."""
    settings = gateway_for("gateway.header_timeout_s=2", "gateway.body_timeout_s=2")
    port = settings.gateway.port
    with running(settings, tmp_path / "gateway.log", prelude=LOW_FILES) as gateway:
        assert gateway.proc is not None
        assert open_files(gateway.proc.pid) == (128, 128)  # soft raised to the hard limit
        head = b"POST /v1/episodes HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
        with trickling(port, 200, head) as slow:
            wait_for(
                lambda: get(base(settings) + "/healthz", timeout=5)[0] == 200,
                timeout=30,
                what="a fresh client answered beside 200 slow connections",
            )
            wait_for(
                slow.all_closed,
                timeout=30,
                what=lambda: f"{200 - len(slow.closed)} slow connections still open",
            )
        body = (
            b"POST /v1/episodes HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"
        )
        with trickling(port, 1, body) as slow:
            wait_for(slow.all_closed, timeout=20, what="the slow body's connection closed")
            (answer,) = slow.received.values()
        assert answer.startswith(b"HTTP/1.1 408 "), answer
        assert b'"code":"body_timeout"' in answer
        refused = 'stream_export_gateway_refused_requests_total{reason="body_timeout"}'
        assert metric(settings, refused) == 1


def test_bodies_are_bounded_in_size_and_in_flight_before_the_upstream_is_asked(
    gateway_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    """A body over gateway.max_request_bytes, and a call whose messages alone are
    over assemble.max_event_bytes (it could not be recorded), are refused with 413
    and never reach the upstream. While gateway.max_inflight_request_bytes are held
    by bodies being read or served, a request that would pass it is refused with
    503 and Retry-After before its body is read; a smaller one still goes."""
    with recording(vllm_server.url) as upstream:
        settings = gateway_for(
            f"gateway.upstreams={upstream.url}",
            "assemble.max_event_bytes=65536",
            "gateway.max_request_bytes=131072",
            "gateway.max_inflight_request_bytes=131072",
            "gateway.body_timeout_s=5",
        )
        start = base(settings) + "/v1/episodes"
        with running(settings, tmp_path / "gateway.log"):
            key = post(start, {"agent_id": "a"})[1]["episode_id"]
            calls = f"{base(settings)}/episodes/{key}/v1/chat/completions"
            too_big = post(calls, chat(140_000))
            assert code(too_big) == (413, "request_too_large")
            unrecordable = post(calls, chat(70_000, max_tokens=2))
            assert code(unrecordable) == (413, "call_too_large")
            assert upstream.exchanges == []  # neither was sampled
            status, answer, _ = post(calls, chat(max_tokens=2, seed=1))
            assert status == 200 and len(upstream.exchanges) == 1, answer

            held = (
                b"POST /v1/episodes HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n"
            ) + b'{"agent_id": "'
            in_flight = "stream_export_gateway_request_bytes_in_flight"
            with trickling(settings.gateway.port, 1, held) as slow:
                wait_for(reaches(settings, in_flight, 100_000), timeout=10, what=in_flight)
                large = {"agent_id": "a", "prompt": "x" * 40_000}
                status, refused, headers = post(start, large)
                assert (status, refused["error"]["code"]) == (503, "requests_in_flight")
                assert headers["Retry-After"] == "1"
                assert post(start, {"agent_id": "small"})[0] == 200  # 100 kB + a small one fit
                wait_for(slow.all_closed, timeout=20, what="the held body's 408")
                (answer_held,) = slow.received.values()
            assert answer_held.startswith(b"HTTP/1.1 408 ")
            assert metric(settings, in_flight) == 0
            assert post(start, large)[0] == 200
            status, ended, _ = post(f"{start}/{key}/end", {"outcome": "success"})
            assert (status, ended["steps"]) == (200, 1)
            counted = {
                reason: metric(
                    settings, f'stream_export_gateway_refused_requests_total{{reason="{reason}"}}'
                )
                for reason in ("request_too_large", "requests_in_flight", "body_timeout")
            }
            rejected = 'stream_export_gateway_calls_total{endpoint="chat",outcome="rejected"}'
            assert metric(settings, rejected) == 1
    assert counted == {"request_too_large": 1, "requests_in_flight": 1, "body_timeout": 1}
    assert len(upstream.exchanges) == 1


def test_with_client_keys_an_episode_belongs_to_the_key_that_started_it(
    gateway_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    """An episode id is no credential when client keys are on: not as the Bearer
    key of an unbound call, of /v1/models or of an end, nor beside its own path
    prefix; another client key is refused (403) on the episode's calls, /models and
    end. Only the key that started it uses it, after a restart too."""
    keys = tmp_path / "keys"
    keys.write_text("team-a\nteam-b\n")
    settings = gateway_for(f"gateway.api_keys_file={keys}")
    g = base(settings)
    body = {**chat(max_tokens=3), "model": vllm_server.model}
    sent = []
    with running(settings, tmp_path / "gateway.log"):
        episode = post(g + "/v1/episodes", {"agent_id": "a"}, key="team-a")[1]
        key = episode["episode_id"]
        own = f"{g}/episodes/{key}/v1"
        end = f"{g}/v1/episodes/{key}/end"
        as_episode = bearer(key)
        refused = [
            code(request(g + "/v1/chat/completions", json.dumps(body).encode(), as_episode)),
            code(request(g + "/v1/models", None, as_episode)),
            code(request(own + "/chat/completions", json.dumps(body).encode(), as_episode)),
            code(request(own + "/models", None, as_episode)),
            code(request(end, b"{}", as_episode)),
            code(request(end, b"{}")),
        ]
        assert refused == [(401, "invalid_api_key")] * 6
        other = bearer("team-b")
        assert code(request(own + "/chat/completions", json.dumps(body).encode(), other)) == (
            403,
            "wrong_api_key",
        )
        assert code(request(own + "/models", None, other)) == (403, "wrong_api_key")
        assert code(request(end, b"{}", other)) == (403, "wrong_api_key")
        assert request(g + "/v1/models", None, other)[0] == 200  # any key lists the models
        service = {**other, "Host": "gateway.agents.svc"}  # with keys, any name
        assert request(g + "/v1/models", None, service)[0] == 200
        client = OpenAI(base_url=episode["base_url"], api_key="team-a", max_retries=0)
        sent.append({**body, "seed": 1})
        client.chat.completions.create(**sent[-1])
    with running(settings, tmp_path / "gateway.log"):  # the owner survives a restart
        assert request(end, b"{}", other)[0] == 403
        sent.append({**body, "seed": 2})
        client.chat.completions.create(**sent[-1])
        status, ended, _ = post(end, {"outcome": "success"}, key="team-a")
        assert (status, ended["steps"]) == (200, 2)
    steps = [e for e in events_of(settings, key) if isinstance(e, Step)]
    assert_vllm_sampled_what_was_recorded(vllm_server, sent, steps)


def test_hostile_requests_are_refused_and_nothing_internal_is_shown(
    gateway_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """With closed defaults (no keys, loopback): another Host is refused (DNS
    rebinding), a POST that is not JSON too (blind CSRF), the Host is never echoed
    into a base URL, the default body bound is the event cap, deep nesting is a
    400; with the upstream down, /v1/models and calls are 502s that name no
    internal address (the operator's log does)."""
    dead = free_port()
    settings = gateway_for(
        f"gateway.upstreams=http://127.0.0.1:{dead}/v1",
        "gateway.upstream_retries=0",
        "assemble.max_event_bytes=65536",
        "gateway.allowed_hosts=gw.internal",
    )
    g, port = base(settings), settings.gateway.port
    start = g + "/v1/episodes"
    with running(settings, tmp_path / "gateway.log") as gateway:
        evil = {"Host": f"evil.example:{port}"}
        assert code(request(start, b'{"agent_id":"a"}', evil)) == (421, "host_not_allowed")
        assert code(request(g + "/v1/models", None, evil)) == (421, "host_not_allowed")
        assert request(g + "/healthz", None, evil)[0] == 200  # probes use any name
        for host in (f"gw.internal:{port}", f"localhost:{port}", f"127.0.0.1:{port}"):
            status, started, _ = request(start, b'{"agent_id":"a"}', {"Host": host})
            assert status == 200, started
            key = started["episode_id"]
            assert started["base_url"] == f"http://127.0.0.1:{port}/episodes/{key}/v1"
        browser = {"Content-Type": "text/plain", "Origin": "http://evil.example"}
        assert code(request(start, b'{"agent_id":"a"}', browser)) == (415, "not_json_type")
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        assert code(request(start, b'{"agent_id":"a"}', form)) == (415, "not_json_type")

        assert code(post(start, {"agent_id": "a", "prompt": "x" * 70_000})) == (
            413,
            "request_too_large",
        )
        deep = b"[" * 30_000 + b"]" * 30_000  # deeper than any decoder goes
        assert code(request(start, deep)) == (400, "too_deep")
        nested: Any = "leaf"
        for _ in range(70):
            nested = [nested]
        assert code(post(start, {"agent_id": "a", "metadata": {"x": nested}})) == (400, "too_deep")

        models = request(g + "/v1/models")
        call = post(f"{g}/episodes/{key}/v1/chat/completions", chat(max_tokens=2))
        assert code(models) == (502, "upstream") and code(call) == (502, "upstream")
        for answer in (models, call):
            shown = json.dumps(answer[1])
            assert str(dead) not in shown and "127.0.0.1" not in shown, shown
        wait_for(lambda: str(dead) in gateway.log(), timeout=10, what="the address in the log")
        counted = {
            reason: metric(
                settings, f'stream_export_gateway_refused_requests_total{{reason="{reason}"}}'
            )
            for reason in ("host_not_allowed", "not_json_type", "request_too_large", "too_deep")
        }
    assert counted == {
        "host_not_allowed": 2,
        "not_json_type": 2,
        "request_too_large": 1,
        "too_deep": 2,
    }


def test_quotas_cap_max_tokens_and_calls_a_minute_per_key(
    gateway_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keys.write_text("team-a\nteam-b\n")
    settings = gateway_for(
        f"gateway.api_keys_file={keys}",
        "gateway.max_tokens_per_call=4",
        "gateway.calls_per_minute=2",
    )
    g = base(settings)
    with running(settings, tmp_path / "gateway.log"):
        clients = {}
        for team in ("team-a", "team-b"):
            episode = post(g + "/v1/episodes", {"agent_id": team}, key=team)[1]
            clients[team] = OpenAI(base_url=episode["base_url"], api_key=team, max_retries=0)
        ask: Any = {"model": vllm_server.model, "messages": [{"role": "user", "content": "Go on."}]}
        with pytest.raises(openai.BadRequestError) as over:
            clients["team-a"].chat.completions.create(**ask, max_tokens=5, seed=1)
        assert over.value.code == "max_tokens_too_large"
        capped = clients["team-a"].chat.completions.create(**ask, seed=1)
        assert capped.usage is not None and capped.usage.completion_tokens <= 4
        direct = vllm_server.post("/v1/chat/completions", {**ask, "seed": 1, "max_tokens": 4})
        assert capped.choices[0].message.content == direct["choices"][0]["message"]["content"]
        clients["team-a"].chat.completions.create(**ask, max_tokens=2, seed=2)
        with pytest.raises(openai.RateLimitError) as limited:
            clients["team-a"].chat.completions.create(**ask, max_tokens=2, seed=3)
        assert limited.value.code == "rate_limited"
        assert 1 <= int(limited.value.response.headers["Retry-After"]) <= 30
        clients["team-b"].chat.completions.create(**ask, max_tokens=2, seed=4)  # its own budget
        outcomes = {
            outcome: metric(
                settings,
                f'stream_export_gateway_calls_total{{endpoint="chat",outcome="{outcome}"}}',
            )
            for outcome in ("recorded", "rejected", "rate_limited")
        }
    assert outcomes == {"recorded": 3, "rejected": 1, "rate_limited": 1}


@pytest.mark.parametrize(
    ("more", "said"),
    [
        ((), "gateway_without_keys"),
        (("gateway.allow_without_keys=true",), "kafka_unavailable"),
        (("gateway.host=127.0.0.1",), "kafka_unavailable"),
    ],
    ids=["refused", "allowed", "loopback"],
)
def test_a_keyless_gateway_beyond_loopback_refuses_to_start(
    settings_for: Callable[..., Settings], more: tuple[str, ...], said: str
) -> None:
    """Checked before Kafka (a broker that is not there shows which check failed
    first), so a refused gateway never listens; nothing here listens beyond
    loopback (the allowed ones stop at the Kafka check)."""
    settings = settings_for(
        "kafka.bootstrap_servers=127.0.0.1:1",
        "gateway.host=0.0.0.0",
        f"gateway.port={free_port()}",
        *more,
    )
    done = subprocess.run(
        [sys.executable, "-m", "stream_export", "gateway", *settings_args(settings)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert f"stream-export: {said}: " in done.stderr, done.stderr
    if said == "gateway_without_keys":
        assert (
            "gateway.api_keys_file" in done.stderr and "gateway.allow_without_keys" in done.stderr
        )
