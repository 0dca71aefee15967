"""The gateway's HTTP edge under hostile clients (issue 37), in one command (never
in CI): what each probe got, and the gateway's memory under large bodies.

    python -m bench.gateway_edge [--bootstrap HOST:PORT] [--only NAME ...]

Each probe starts its own ``stream-export gateway`` (fresh topics, its own state
directory) in front of a fixed-answer upstream run in this process
(bench/fixed_upstream.py, counting the calls it was asked), on 127.0.0.1 only:

  memory      24 concurrent chat calls with 15 MiB bodies (with the default
              request bound, then with 16 MiB allowed), 24 and 600 with bodies
              just under 1 MiB (the event cap), and 200 of those while the
              upstream takes 2 s to answer, each on a fresh gateway: statuses, its
              peak RSS (VmHWM) and its RSS 3 s after (retained)
  unrecordable  one 1.5 MiB call (over the 1 MiB event cap): status, upstream asked?
  slow        the gateway at 1,024 open files; 1,100 connections that send a header
              byte a second; how long until a fresh client's /healthz is answered
  nesting     a body of 200,000 nested arrays
  upstream_down  /v1/models and a call with no upstream listening: status, and
              whether the body names the upstream's address
  host        an episode start with ``Host: evil.example``: status and base_url
  csrf        an episode start sent as text/plain with an Origin
  keys        client keys on: an episode id as the Bearer key on an unbound call,
              /v1/models and the end
  exposed     host 0.0.0.0 without client keys: does it start?

Prints one line per probe. The probes use only settings every version has, so the
same command measures before and after a change.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.bench_assemble import _settings
from bench.fixed_upstream import Upstream
from stream_export.settings import Settings
from tests.support.monitoring import free_port
from tests.support.processes import Gateway

MIB = 1 << 20
#: Run in the gateway's process before its CLI: the open-files limit of a
#: default container (soft and hard 1,024).
LOW_FILES = "import resource\nresource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))"


class CountingUpstream(Upstream):
    """The fixed-answer upstream, counting the chat calls it was asked; each answer
    after ``delay_s`` (a busy inference server)."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = 0
        self.delay_s = 0.0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * MIB)  # the gateway's bound, not its own
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def chat(self, request: web.Request) -> web.StreamResponse:
        self.asked += 1
        await asyncio.sleep(self.delay_s)
        return await super().chat(request)


@contextlib.contextmanager
def upstream() -> Iterator[tuple[str, CountingUpstream]]:
    """The counting upstream on its own loop in a thread; its base URL."""
    served = CountingUpstream()
    port = free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(served.app(), access_log=None)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1", served
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


class Probe:
    def __init__(self, bootstrap: str, workdir: Path) -> None:
        self.bootstrap = bootstrap
        self.workdir = workdir

    def settings(self, upstream_url: str, *extra: str) -> Settings:
        token = uuid.uuid4().hex[:8]
        return _settings(
            self.bootstrap,
            token,
            f"gateway.upstreams={upstream_url}",
            f"gateway.port={free_port()}",
            f"gateway.state_dir={self.workdir / token}",
            "gateway.ack_timeout_s=5",
            "topics.partitions=2",
            *extra,
        )

    @contextlib.contextmanager
    def gateway(self, settings: Settings, prelude: str | None = None) -> Iterator[Gateway]:
        log = self.workdir / f"gateway-{settings.gateway.port}.log"
        gateway = Gateway(settings, log, prelude=prelude)
        gateway.start()
        try:
            deadline = time.monotonic() + 60
            while status(url(settings) + "/healthz")[0] != 200:
                if not gateway.alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"the gateway did not start:\n{gateway.log()[-3000:]}")
                time.sleep(0.2)
            yield gateway
        finally:
            gateway.stop()


def url(settings: Settings) -> str:
    return f"http://127.0.0.1:{settings.gateway.port}"


def status(
    address: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 30,
) -> tuple[int, bytes]:
    """(status, body) of a GET (or a POST with ``body``); 0 when it cannot connect."""
    headers = {"Content-Type": "application/json", **(headers or {})}
    request = urllib.request.Request(address, body, headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as failed:
        return failed.code, failed.read()
    except OSError:
        return 0, b""


def start(settings: Settings, key: str | None = None) -> str:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    code, body = status(url(settings) + "/v1/episodes", b'{"agent_id":"a"}', headers)
    assert code == 200, (code, body)
    episode_id: str = json.loads(body)["episode_id"]
    return episode_id


def chat_body(size: int) -> bytes:
    """A chat call's body of about ``size`` bytes."""
    head = b'{"model":"tiny","max_tokens":4,"messages":[{"role":"user","content":"'
    tail = b'"}]}'
    return head + b"x" * max(0, size - len(head) - len(tail)) + tail


def memory_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0])
    return fields


async def concurrent_calls(address: str, count: int, body: bytes) -> dict[int, int]:
    """``count`` calls at once; how many got each status (0: the connection failed)."""
    statuses: dict[int, int] = {}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one() -> None:
            try:
                async with session.post(
                    address, data=body, headers={"Content-Type": "application/json"}
                ) as answer:
                    await answer.read()
                    code = answer.status
            except (aiohttp.ClientError, TimeoutError):
                code = 0
            statuses[code] = statuses.get(code, 0) + 1

        await asyncio.gather(*(one() for _ in range(count)))
    return dict(sorted(statuses.items()))


#: (calls at once, body bytes, the upstream's delay, settings) of each memory row.
MEMORY_ROWS = (
    (24, 15 * MIB, 0.0, ()),
    (24, 15 * MIB, 0.0, ("gateway.max_request_bytes=16777216",)),  # the old default
    (24, MIB - 4096, 0.0, ()),
    (600, MIB - 4096, 0.0, ()),
    (200, MIB - 4096, 2.0, ()),
)


def probe_memory(probe: Probe) -> str:
    lines = []
    with upstream() as (upstream_url, served):
        for count, size, delay_s, extra in MEMORY_ROWS:
            served.delay_s = delay_s
            settings = probe.settings(upstream_url, *extra)
            with probe.gateway(settings) as gateway:  # a fresh one for each
                assert gateway.proc is not None
                pid = gateway.proc.pid
                idle = memory_kib(pid)["VmRSS"]
                key = start(settings)
                address = f"{url(settings)}/episodes/{key}/v1/chat/completions"
                asked = served.asked
                began = time.monotonic()
                statuses = asyncio.run(concurrent_calls(address, count, chat_body(size)))
                took = time.monotonic() - began
                peak = memory_kib(pid)["VmHWM"]
                time.sleep(3)
                retained = memory_kib(pid)["VmRSS"]
            how = "".join(f", {s}" for s in extra)
            how += f", answers after {delay_s:g} s" if delay_s else ""
            lines.append(
                f"  {count} x {size / MIB:.2f} MiB{how}: statuses {statuses}, upstream asked "
                f"{served.asked - asked}, {took:.1f} s; peak RSS {peak / 1024:.0f} MB, "
                f"retained {retained / 1024:.0f} MB (idle {idle / 1024:.0f} MB)"
            )
    return "\n" + "\n".join(lines)


def one_call(probe: Probe, body: bytes) -> tuple[int, bytes, int]:
    """A fresh gateway's answer to one chat call of an episode with this body, and
    how many calls the upstream was asked."""
    with upstream() as (upstream_url, served):
        settings = probe.settings(upstream_url)
        with probe.gateway(settings):
            key = start(settings)
            address = f"{url(settings)}/episodes/{key}/v1/chat/completions"
            code, answer = status(address, body)
    return code, answer, served.asked


def probe_unrecordable(probe: Probe) -> str:
    code, body, asked = one_call(probe, chat_body(MIB * 3 // 2))
    return f"1.5 MiB call: {code} {body[:90]!r}; upstream asked {asked}"


async def slow_clients(host: str, port: int, count: int, seconds: float) -> int:
    """Open ``count`` connections that send a header byte a second for ``seconds``;
    how many of them the server closed meanwhile."""
    writers: list[asyncio.StreamWriter] = []
    for _ in range(count):
        try:
            _, writer = await asyncio.open_connection(host, port)
        except OSError:
            break
        writer.write(b"POST /v1/episodes HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        writers.append(writer)
    closed = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for writer in writers:
            if writer.is_closing():
                continue
            try:
                writer.write(b"X")
                await writer.drain()
            except (ConnectionError, OSError):
                writer.close()
                closed += 1
        await asyncio.sleep(1)
    for writer in writers:
        writer.close()
    return closed


def probe_slow(probe: Probe) -> str:
    with upstream() as (upstream_url, _):
        settings = probe.settings(upstream_url)
        with probe.gateway(settings, prelude=LOW_FILES):
            result: dict[str, Any] = {}

            def attack() -> None:
                result["closed"] = asyncio.run(
                    slow_clients("127.0.0.1", settings.gateway.port, 1100, 45)
                )

            thread = threading.Thread(target=attack)
            thread.start()
            time.sleep(8)  # the connections are open and trickling
            began = time.monotonic()
            answered = 0
            while time.monotonic() - began < 35 and answered != 200:
                answered = status(url(settings) + "/healthz", timeout=3)[0]
            took = time.monotonic() - began
            thread.join()
    got = f"answered after {took:.1f} s" if answered == 200 else f"not answered in {took:.0f} s"
    return f"1,100 slow connections at 1,024 files: /healthz {got}; {result['closed']} closed"


def probe_nesting(probe: Probe) -> str:
    code, body, _ = one_call(probe, b"[" * 200_000 + b"]" * 200_000)
    return f"200k nested arrays: {code} {body[:100]!r}"


def probe_upstream_down(probe: Probe) -> str:
    dead = free_port()
    settings = probe.settings(f"http://127.0.0.1:{dead}/v1", "gateway.upstream_retries=0")
    with probe.gateway(settings):
        models, models_body = status(url(settings) + "/v1/models")
        key = start(settings)
        address = f"{url(settings)}/episodes/{key}/v1/chat/completions"
        call, call_body = status(address, chat_body(200))
    named = [str(dead).encode() in b for b in (models_body, call_body)]
    return (
        f"/v1/models {models} (names the address: {named[0]}); "
        f"a call {call} (names the address: {named[1]}) {call_body[:120]!r}"
    )


def probe_host(probe: Probe) -> str:
    with upstream() as (upstream_url, _):
        settings = probe.settings(upstream_url)
        with probe.gateway(settings):
            code, body = status(
                url(settings) + "/v1/episodes", b'{"agent_id":"a"}', {"Host": "evil.example:9180"}
            )
    shown = json.loads(body).get("base_url") if code == 200 else repr(body[:100])
    return f"Host: evil.example -> {code} {shown}"


def probe_csrf(probe: Probe) -> str:
    with upstream() as (upstream_url, _):
        settings = probe.settings(upstream_url)
        with probe.gateway(settings):
            code, body = status(
                url(settings) + "/v1/episodes",
                b'{"agent_id":"a"}',
                {"Content-Type": "text/plain", "Origin": "http://evil.example"},
            )
    return f"text/plain with an Origin -> {code} {body[:100]!r}"


def probe_keys(probe: Probe) -> str:
    keys = probe.workdir / "keys"
    keys.write_text("team-key\n")
    with upstream() as (upstream_url, served):
        settings = probe.settings(upstream_url, f"gateway.api_keys_file={keys}")
        with probe.gateway(settings):
            key = start(settings, "team-key")
            bearer = {"Authorization": f"Bearer {key}"}
            call = status(url(settings) + "/v1/chat/completions", chat_body(200), bearer)[0]
            models = status(url(settings) + "/v1/models", None, bearer)[0]
            end = status(url(settings) + f"/v1/episodes/{key}/end", b"{}", bearer)[0]
    return (
        f"episode id as the key: unbound call {call} (upstream asked {served.asked}), "
        f"/v1/models {models}, its end {end}"
    )


def probe_exposed(probe: Probe) -> str:
    with upstream() as (upstream_url, _):
        settings = probe.settings(upstream_url, "gateway.host=0.0.0.0")
        log = probe.workdir / "exposed.log"
        gateway = Gateway(settings, log)
        gateway.start()
        try:
            deadline = time.monotonic() + 30
            while gateway.alive() and time.monotonic() < deadline:
                if status(url(settings) + "/healthz", timeout=2)[0] == 200:
                    return "0.0.0.0 without keys: started and answers"
                time.sleep(0.3)
            assert gateway.proc is not None
            last = gateway.log().strip().splitlines()[-1:]
            return f"0.0.0.0 without keys: exited {gateway.proc.returncode}: {last}"
        finally:
            gateway.stop()


PROBES: dict[str, Callable[[Probe], str]] = {
    "memory": probe_memory,
    "unrecordable": probe_unrecordable,
    "slow": probe_slow,
    "nesting": probe_nesting,
    "upstream_down": probe_upstream_down,
    "host": probe_host,
    "csrf": probe_csrf,
    "keys": probe_keys,
    "exposed": probe_exposed,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gateway_edge", description=__doc__)
    p.add_argument(
        "--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    )
    p.add_argument("--only", nargs="*", choices=sorted(PROBES), default=list(PROBES))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gateway-edge-") as tmp:
        probe = Probe(args.bootstrap, Path(tmp))
        for name in args.only:
            print(f"{name}: {PROBES[name](probe)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
