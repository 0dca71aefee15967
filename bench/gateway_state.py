"""The gateway's state under many open long-context episodes (issue 37), in one
command (never in CI).

    python -m bench.gateway_state [--episodes 700] [--restart-episodes 1200]
        [--prompt-kb 33] [--calls 100] [--big-starts 500] [--big-kb 900]
        [--idle-timeout S] [--bootstrap HOST:PORT] [--workdir DIR] [--results DIR]

Runs `stream-export gateway` in front of a byte-level stand-in for vLLM
(tests/support/byte_upstream.py: a prompt's ids are its bytes, so a 33 KB
prompt is 33k ids) and measures, one client calling one episode at a time:

1. the latency of ``--calls`` short calls of an empty gateway (p50, p99; after
   10 calls not measured) and the bytes the gateway wrote to disk meanwhile
   (/proc/<pid>/io);
2. the same with ``--episodes`` open episodes, each after one call of a
   ``--prompt-kb`` prompt, then with ``--restart-episodes``;
3. a restart on that state directory: the time until /healthz answers and the
   peak resident memory (VmHWM) of the restarted gateway;
4. ``--big-starts`` episode starts with ``--big-kb`` prompts: resident memory
   (VmRSS) before and after, and, with ``--idle-timeout`` (sets
   ``gateway.idle_timeout_s``), once the gateway expired them.

Without --bootstrap it starts a broker of its own (dev/kafka). Results go to
bench/results/<date>-gateway-state.md and .json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import aiohttp
import msgspec

from bench import BenchError
from bench.bench_assemble import _settings
from bench.harness import broker
from bench.progress import Progress
from bench.report import (
    Heading,
    Results,
    heading,
    num,
    page,
    results_json,
    results_option,
    row,
    title,
)
from bench.systems import peak_rss_mb
from stream_export.kafka import topics
from stream_export.settings import Settings
from tests.support import byte_upstream
from tests.support.monitoring import free_port
from tests.support.processes import Gateway

PROG: Final = "python -m bench.gateway_state"
SHORT: Final = "What is the weather in Oslo today?"
#: Concurrent clients filling the gateway with open episodes.
FILLERS: Final = 8
#: Calls of each latency measurement not measured (the first connections).
WARMUP: Final = 10
#: Times a call refused with 503 is sent again.
RETRIES: Final = 20


class Latency(msgspec.Struct):
    open_episodes: int
    p50_ms: float
    p99_ms: float
    #: Bytes the gateway wrote to disk during the calls (/proc/<pid>/io write_bytes).
    written_mb: float
    #: Calls refused with 503 so far (retried), filling included.
    refused: int


class Restart(msgspec.Struct):
    open_episodes: int
    healthz_s: float
    peak_rss_mb: float


class BigStarts(msgspec.Struct):
    starts: int
    prompt_kb: int
    rss_before_mb: float
    rss_after_mb: float
    #: After the gateway expired them (--idle-timeout), else None.
    rss_expired_mb: float | None
    open_after_expiry: int | None


class Report(Heading, kw_only=True):
    prompt_kb: int
    latency: list[Latency]
    restart: Restart | None
    big: BigStarts | None


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--episodes", type=int, default=700)
    p.add_argument("--restart-episodes", type=int, default=1200)
    p.add_argument("--prompt-kb", type=int, default=33)
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--big-starts", type=int, default=500)
    p.add_argument("--big-kb", type=int, default=900)
    p.add_argument("--idle-timeout", type=float, help="gateway.idle_timeout_s (none: not set)")
    p.add_argument("--bootstrap", help="use this broker instead of starting one")
    p.add_argument("--workdir", type=Path, help="logs and state (a new temporary folder)")
    results_option(p)
    args = p.parse_args(argv)
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-gateway-state-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    return args


def proc_value(pid: int, file: str, field: str) -> int:
    """One ``field: value`` line of /proc/<pid>/<file> (kB figures stay in kB)."""
    for line in Path(f"/proc/{pid}/{file}").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise BenchError(f"no {field} in /proc/{pid}/{file}")


class Bench:
    def __init__(self, args: argparse.Namespace, settings: Settings, progress: Progress) -> None:
        self.args, self.settings, self.progress = args, settings, progress
        self.base = f"http://127.0.0.1:{settings.gateway.port}"
        self.gateway: Gateway | None = None
        self.open = 0
        #: Calls the gateway refused with 503 (each sent again).
        self.refused = 0

    @property
    def pid(self) -> int:
        assert self.gateway is not None and self.gateway.proc is not None
        return self.gateway.proc.pid

    def start_gateway(self, log: str) -> float:
        """Start the gateway; seconds until /healthz answers."""
        began = time.monotonic()
        self.gateway = Gateway(self.settings, self.args.workdir / log)
        self.gateway.start()
        asyncio.run(self._healthy())
        return time.monotonic() - began

    async def _healthy(self) -> None:
        async with aiohttp.ClientSession() as s:
            for _ in range(1200):
                assert self.gateway is not None
                if not self.gateway.alive():
                    raise BenchError(f"the gateway exited; see {self.gateway.log_path}")
                try:
                    async with s.get(self.base + "/healthz") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)
        raise BenchError("the gateway did not answer /healthz within 60 s")

    def stop_gateway(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()

    async def episode(self, s: aiohttp.ClientSession, prompt: str = "Weather?") -> str:
        body = {"agent_id": "bench", "prompt": prompt}
        got = await self.post(s, self.base + "/v1/episodes", body)
        return str(got["episode_id"])

    async def call(self, s: aiohttp.ClientSession, key: str, text: str) -> None:
        body = {"model": "bytes", "messages": [{"role": "user", "content": text}]}
        await self.post(s, f"{self.base}/episodes/{key}/v1/chat/completions", body)

    async def post(self, s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
        """The answer, sent again after Retry-After while the gateway answers 503 (a
        slow gateway's Kafka acknowledgement times out), at most RETRIES times."""
        for _ in range(RETRIES):
            async with s.post(url, json=body) as r:
                got = await r.json()
                if r.status == 200:
                    return got
                if r.status != 503:
                    raise BenchError(f"{url} answered {r.status}: {got}")
                self.refused += 1
                await asyncio.sleep(float(r.headers.get("Retry-After", "1")))
        raise BenchError(f"{url} answered 503 {RETRIES} times")

    def latency(self) -> Latency:
        async def go() -> list[float]:
            async with aiohttp.ClientSession() as s:
                key = await self.episode(s)
                for n in range(WARMUP):
                    await self.call(s, key, f"{SHORT} (warm-up {n})")
                times = []
                for n in range(self.args.calls):
                    began = time.perf_counter()
                    await self.call(s, key, f"{SHORT} ({n})")
                    times.append(time.perf_counter() - began)
                return times

        before = proc_value(self.pid, "io", "write_bytes")
        times = asyncio.run(go())
        written = proc_value(self.pid, "io", "write_bytes") - before
        self.open += 1
        cuts = statistics.quantiles(times, n=100)
        return Latency(self.open, cuts[49] * 1e3, cuts[98] * 1e3, written / 1e6, self.refused)

    def fill(self, total: int) -> None:
        """Open episodes, each after one call of a --prompt-kb prompt, up to ``total``."""
        todo = max(0, total - self.open)
        long = ("The long context of a rollout. " * (self.args.prompt_kb * 40))[
            : self.args.prompt_kb * 1000
        ]

        async def filler(s: aiohttp.ClientSession, share: list[int]) -> None:
            while share[0] < todo:
                share[0] += 1
                key = await self.episode(s)
                await self.call(s, key, long + uuid.uuid4().hex)
                self.progress.show(share[0] / todo)

        async def go() -> None:
            share = [0]
            async with aiohttp.ClientSession() as s:
                await asyncio.gather(*(filler(s, share) for _ in range(FILLERS)))

        asyncio.run(go())
        self.open += todo

    def big_starts(self) -> BigStarts:
        args = self.args
        prompt = "x" * (args.big_kb * 1000)
        before = proc_value(self.pid, "status", "VmRSS") / 1024

        async def go() -> None:
            async with aiohttp.ClientSession() as s:
                for _ in range(args.big_starts):
                    await self.episode(s, prompt)

        asyncio.run(go())
        after = proc_value(self.pid, "status", "VmRSS") / 1024
        expired, left = None, None
        if args.idle_timeout is not None:
            left = asyncio.run(self._expired(time.monotonic() + args.idle_timeout * 3 + 30))
            expired = proc_value(self.pid, "status", "VmRSS") / 1024
        return BigStarts(args.big_starts, args.big_kb, before, after, expired, left)

    async def _expired(self, deadline: float) -> int:
        """Wait until the gateway holds no open episode (all expired) or ``deadline``
        (time.monotonic()) passes; how many are left."""
        async with aiohttp.ClientSession() as s:
            while True:
                async with s.get(self.base + "/healthz") as r:
                    left = int((await r.json())["open_episodes"])
                if left == 0 or time.monotonic() > deadline:
                    return left
                await asyncio.sleep(0.5)


def run(args: argparse.Namespace, bootstrap: str, progress: Progress) -> dict[str, Any]:
    with ExitStack() as stack:
        upstream = stack.enter_context(byte_upstream.running())
        extra = [f"gateway.idle_timeout_s={args.idle_timeout}"] if args.idle_timeout else []
        settings = _settings(
            bootstrap,
            uuid.uuid4().hex[:8],
            f"gateway.upstreams={upstream}",
            f"gateway.port={free_port()}",
            f"gateway.state_dir={args.workdir / 'gateway-state'}",
            f"assemble.max_event_bytes={4 << 20}",
            *extra,
        )
        asyncio.run(topics.ensure(settings))
        bench = Bench(args, settings, progress)
        stack.callback(bench.stop_gateway)
        progress.step("an empty gateway")
        bench.start_gateway("gateway.log")
        latency = [bench.latency()]
        for total in sorted({args.episodes, args.restart_episodes} - {0}):
            progress.step(f"opening {total} episodes of {args.prompt_kb} KB prompts")
            bench.fill(total)
            progress.step(f"calls with {total} open episodes")
            latency.append(bench.latency())
        progress.step("a restart on that state")
        bench.stop_gateway()
        healthz = bench.start_gateway("gateway-restarted.log")
        restart = Restart(bench.open, healthz, peak_rss_mb(bench.pid))
        big = None
        if args.big_starts:
            progress.step(f"{args.big_starts} starts with {args.big_kb} KB prompts")
            big = bench.big_starts()
    return {"latency": latency, "restart": restart, "big": big}


def markdown(report: Report) -> str:
    lines = [
        *title(
            "The gateway's state under open episodes",
            report,
            f"one client, each open episode after one call of a {report.prompt_kb} KB prompt",
        ),
        "",
        row("open episodes", "p50 ms", "p99 ms", "MB written during the calls", "503s so far"),
        row("---:", "---:", "---:", "---:", "---:"),
    ]
    lines += [
        row(at.open_episodes, num(at.p50_ms), num(at.p99_ms), num(at.written_mb), at.refused)
        for at in report.latency
    ]
    if report.restart is not None:
        r = report.restart
        lines += [
            "",
            f"Restart with {r.open_episodes} open episodes: /healthz after {num(r.healthz_s)} s, "
            f"peak RSS {num(r.peak_rss_mb)} MB.",
        ]
    if report.big is not None:
        b = report.big
        lines += [
            "",
            f"{b.starts} starts with {b.prompt_kb} KB prompts: RSS {num(b.rss_before_mb)} -> "
            f"{num(b.rss_after_mb)} MB"
            + (
                f"; after expiry {num(b.rss_expired_mb)} MB ({b.open_after_expiry} still open)."
                if b.rss_expired_mb is not None
                else "."
            ),
        ]
    return page(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    progress = Progress(steps=3 + 2 * len({args.episodes, args.restart_episodes} - {0}))
    progress.note(f"logs and state in {args.workdir}")
    try:
        with broker(args, progress) as (bootstrap, where):
            measured = run(args, bootstrap, progress)
    except BenchError as exc:
        progress.close()
        print(f"{PROG}: {exc.detail}", file=sys.stderr)
        return 1
    progress.close()
    now = datetime.now(UTC)
    report = Report(**heading(PROG, argv, now, where), prompt_kb=args.prompt_kb, **measured)
    Results(args.results, now, "gateway-state").write(markdown(report), results_json(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
