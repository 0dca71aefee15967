"""The gateway's overhead beside LiteLLM's proxy (issue 27, Performance), in one
command (never in CI).

    python -m bench.gateway [--quick] [--bootstrap HOST:PORT] [--rounds 3] [--seconds 5]
                            [--vllm URL]

Starts a fixed-answer upstream (bench/fixed_upstream.py: every chat completion
answered at once, the same 16 tokens in vLLM's shape with token ids and logprobs
when asked; not an inference server), `stream-export gateway` and LiteLLM's proxy
in front of it (LiteLLM in its own pinned environment, built by `dev/litellm setup`
into dev/.cache when missing: never a dependency of the package), then runs, in
alternating rounds, every cell (1, 16 and 64 concurrent clients; non-streaming and
streaming) against direct, gateway and LiteLLM in turn. Reports p50/p99 latency,
req/s, the time each proxy adds over direct and issue 27's bars (min/median/max
over rounds) to bench/results/<date>-gateway.md and .json. Without --bootstrap it
starts a broker of its own (dev/kafka) and stops it at the end. With --vllm (a
running vLLM, e.g. `dev/vllm start`'s), each round also measures direct and a
second gateway in front of that real server at the highest concurrency: the
throughput bar with an upstream that does work.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import aiohttp
import msgspec

from bench import BenchError
from bench.bench_assemble import _settings
from bench.gateway_load import Measured, drive
from bench.gateway_report import (
    DIRECT,
    GATEWAY,
    LITELLM,
    MODES,
    VLLM_ASKED,
    VLLM_DIRECT,
    VLLM_GATEWAY,
    GatewayReport,
    Reading,
    Usage,
    cell,
    machine_jiffies,
    markdown,
    mode_name,
    to_json,
    usage,
)
from bench.harness import on_broker, rounds_heading
from bench.progress import Progress
from bench.report import Results, results_option
from bench.systems import cpu_seconds
from stream_export.kafka import topics
from stream_export.settings import Settings
from tests.support.monitoring import free_port
from tests.support.processes import Gateway

PROG: Final = "python -m bench.gateway"
ROOT: Final = Path(__file__).resolve().parent.parent
LITELLM_LOCK: Final = ROOT / "dev" / "litellm.lock"
QUICK: Final = {"rounds": 1, "seconds": 2.0, "warmup": 0.5}
DEFAULTS: Final = {"rounds": 3, "seconds": 5.0, "warmup": 1.0}
KEY: Final = "sk-bench-" + "0" * 32
#: In front of the fixed-answer upstream, at every concurrency.
FIXED: Final = (DIRECT, GATEWAY, LITELLM)
#: In front of a real vLLM (--vllm), at the highest concurrency only.
SERVED: Final = (VLLM_DIRECT, VLLM_ASKED, VLLM_GATEWAY)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a smoke run: 1 round of 2 s cells")
    p.add_argument("--bootstrap", help="use this broker instead of starting one")
    p.add_argument("--rounds", type=int, help=f"rounds of all cells ({DEFAULTS['rounds']})")
    p.add_argument("--seconds", type=float, help=f"measured seconds a cell ({DEFAULTS['seconds']})")
    p.add_argument("--warmup", type=float, help=f"warm-up seconds a cell ({DEFAULTS['warmup']})")
    p.add_argument(
        "--clients", default="1,16,64", help="concurrent clients, comma-separated (1,16,64)"
    )
    p.add_argument(
        "--vllm", metavar="URL", help="also measure in front of this vLLM (dev/vllm start)"
    )
    p.add_argument(
        "--served-seconds",
        type=float,
        default=20.0,
        help="measured seconds of a cell in front of vLLM, whose calls take ~1 s (20)",
    )
    p.add_argument("--workdir", type=Path, help="logs and state (a new temporary folder)")
    results_option(p)
    args = p.parse_args(argv)
    for name, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.concurrency = sorted({int(c) for c in args.clients.split(",")})
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    return args


def litellm_python() -> Path:
    """dev/litellm's environment (built when missing): its python."""
    done = subprocess.run(
        [str(ROOT / "dev" / "litellm"), "setup"], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise BenchError(f"dev/litellm setup failed:\n{done.stderr}")
    return Path(done.stdout.strip().splitlines()[-1])


def litellm_version() -> str:
    for line in LITELLM_LOCK.read_text().splitlines():
        if line.startswith("litellm=="):
            return line.split("==", 1)[1]
    raise BenchError(f"litellm missing from {LITELLM_LOCK}")


def filesystem(path: Path) -> str:
    """The type of the file system ``path`` is on (/proc/mounts' longest match)."""
    best, kind = "", "unknown"
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mount, fs, *_ = line.split()
        if str(path.resolve()).startswith(mount) and len(mount) > len(best):
            best, kind = mount, fs
    return kind


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@contextmanager
def child(
    cmd: list[str], log: Path, ready: str, env: dict[str, str] | None = None
) -> Iterator[int]:
    """A server as a child process until it answers GET ``ready``; its pid."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=log.parent,
            env=env,
            start_new_session=True,
        )
    try:
        waited(lambda: answers(ready), lambda: proc.poll() is None, log)
        yield proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def waited(
    ok: Callable[[], bool], alive: Callable[[], bool], log: Path, timeout: float = 120
) -> None:
    async def wait() -> None:
        async with asyncio.timeout(timeout):
            while not ok():
                if not alive():
                    raise BenchError(f"exited before answering; see {log}")
                await asyncio.sleep(0.25)

    try:
        asyncio.run(wait())
    except TimeoutError:
        raise BenchError(f"did not answer within {timeout:.0f} s; see {log}") from None


class Run:
    """The three targets, started, and the rounds over them."""

    def __init__(self, args: argparse.Namespace, bootstrap: str, progress: Progress) -> None:
        self.args = args
        self.bootstrap = bootstrap
        self.progress = progress
        self.workdir: Path = args.workdir
        self.urls: dict[str, str] = {}
        self.pids: dict[str, list[int]] = {}
        self.notes: list[str] = []

    def start(self, stack: ExitStack) -> None:
        d = self.workdir
        up_port, gw_port, ll_port = free_port(), free_port(), free_port()
        upstream = f"http://127.0.0.1:{up_port}/v1"
        self.progress.step("starting the fixed-answer upstream and the gateway")
        up = [sys.executable, "-m", "bench.fixed_upstream", "--port", str(up_port)]
        self.pids[DIRECT] = [
            stack.enter_context(child(up, d / "upstream.log", upstream + "/models"))
        ]
        settings = self.gateway_settings(upstream, gw_port)
        asyncio.run(topics.ensure(settings))
        self.gateway(stack, GATEWAY, settings, d / "gateway.log")
        if self.args.vllm:
            vllm = self.args.vllm.rstrip("/") + "/v1"
            for direct in (VLLM_DIRECT, VLLM_ASKED):
                self.urls[direct], self.pids[direct] = vllm + "/chat/completions", []
            again = self.gateway_settings(vllm, free_port(), "gateway-vllm-state")
            self.gateway(stack, VLLM_GATEWAY, again, d / "gateway-vllm.log")
        self.progress.step("building LiteLLM's environment (dev/litellm setup) and starting it")
        python = litellm_python()
        config = d / "litellm.yaml"
        config.write_text(
            "model_list:\n  - model_name: tiny\n    litellm_params:\n      model: openai/tiny\n"
            f"      api_base: {upstream}\n      api_key: none\n"
            f"general_settings:\n  master_key: {KEY}\n"
        )
        env = {
            **os.environ,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_LOG": "ERROR",
        }
        cmd = [str(python.parent / "litellm"), "--config", str(config), "--host", "127.0.0.1"]
        cmd += ["--port", str(ll_port), "--num_workers", "1"]
        ready = f"http://127.0.0.1:{ll_port}/health/liveliness"
        self.pids[LITELLM] = [stack.enter_context(child(cmd, d / "litellm.log", ready, env))]
        self.urls[DIRECT] = upstream + "/chat/completions"
        self.urls[LITELLM] = f"http://127.0.0.1:{ll_port}/v1/chat/completions"
        self.notes.append(
            f"the gateway's state directory (its write-ahead log, fsync'd each call) is on "
            f"{filesystem(d)}"
        )

    def gateway(self, stack: ExitStack, target: str, settings: Settings, log: Path) -> None:
        """Start a gateway for ``target`` and wait until it answers."""
        gateway = stack.enter_context(Gateway(settings, log))
        base = f"http://127.0.0.1:{settings.gateway.port}"
        waited(lambda: answers(base + "/healthz"), gateway.alive, log)
        assert gateway.proc is not None
        self.pids[target], self.urls[target] = [gateway.proc.pid], base

    def gateway_settings(self, upstream: str, port: int, state: str = "gateway-state") -> Settings:
        d = self.workdir
        keys = d / "gateway-keys"
        keys.write_text(KEY + "\n")
        token = d.name.rsplit("-", 1)[-1][:8].lower()
        return _settings(
            self.bootstrap,
            token,
            f"gateway.upstreams={upstream}",
            f"gateway.port={port}",
            f"gateway.state_dir={d / state}",
            f"gateway.api_keys_file={keys}",
        )

    def window_s(self, target: str) -> float:
        """A cell's measured seconds (vLLM's calls take ~1 s: its cells run longer)."""
        return float(self.args.served_seconds if target in SERVED else self.args.seconds)

    def measure(self, target: str, clients: int, stream: bool) -> tuple[Measured, Usage]:
        """What the clients measured, and the CPU used over the window."""
        pids = self.pids[target]
        readings: list[Reading] = []

        def window(_: bool) -> None:
            own = os.times()
            readings.append(
                Reading(
                    target_s=sum(cpu_seconds(p) for p in pids),
                    client_s=own.user + own.system,
                    machine=machine_jiffies(Path("/proc/stat").read_text()),
                )
            )

        async def go() -> Measured:
            headers = {"Authorization": f"Bearer {KEY}"}
            if target not in (GATEWAY, VLLM_GATEWAY):
                urls = [self.urls[target]] * clients
                return await drive(
                    urls,
                    headers,
                    stream,
                    self.args.warmup,
                    self.window_s(target),
                    window,
                    tokens=target == VLLM_ASKED,
                )
            episodes = await self.episodes(self.urls[target], clients, headers)
            try:
                urls = [f"{b}/chat/completions" for b in episodes.values()]
                return await drive(
                    urls, headers, stream, self.args.warmup, self.window_s(target), window
                )
            finally:
                await self.end(self.urls[target], list(episodes), headers)

        measured = asyncio.run(go())
        if len(readings) != 2:
            raise BenchError(f"{target}: the measuring window never opened")
        used = usage(*readings)
        return measured, used if pids else msgspec.structs.replace(used, target_s=math.nan)

    async def episodes(self, gateway: str, n: int, headers: dict[str, str]) -> dict[str, str]:
        """``n`` episodes of the gateway at ``gateway``: id -> base URL."""
        out = {}
        async with aiohttp.ClientSession() as s:
            for _ in range(n):
                body = {"agent_id": "bench", "prompt": "Weather?"}
                async with s.post(gateway + "/v1/episodes", json=body, headers=headers) as r:
                    started = await r.json()
                    if r.status != 200:
                        raise BenchError(f"the gateway did not start an episode: {started}")
                out[started["episode_id"]] = started["base_url"]
        return out

    async def end(self, gateway: str, ids: list[str], headers: dict[str, str]) -> None:
        async with aiohttp.ClientSession() as s:
            for key in ids:
                url = f"{gateway}/v1/episodes/{key}/end"
                async with s.post(url, json={"outcome": "success"}, headers=headers) as r:
                    await r.read()

    def rounds(self, report: GatewayReport) -> None:
        args = self.args
        served = list(itertools.product([max(args.concurrency)], MODES, SERVED))
        fixed = list(itertools.product(args.concurrency, MODES, FIXED))
        plan = [
            (r, *c)
            for r in range(1, args.rounds + 1)
            for c in fixed + (served if args.vllm else [])
        ]
        for r, clients, stream, target in plan:
            self.progress.step(
                f"round {r}/{args.rounds}: {target}, {clients} clients, {mode_name(stream)}"
            )
            try:
                got, used = self.measure(target, clients, stream)
            except BenchError as exc:  # a cell lost, not the run
                self.notes.append(
                    f"round {r}, {target}, {clients} clients, {mode_name(stream)}: not measured: "
                    f"{exc.detail} (logs in {self.workdir})"
                )
                self.progress.note(self.notes[-1])
                continue
            made = cell(target, clients, stream, r, got, self.window_s(target), used)
            report.cells.append(made)
            if got.errors:
                self.notes.append(
                    f"round {r}, {target}, {clients} clients, {mode_name(stream)}: {got.errors} "
                    f"failed calls, the first: {got.first_error}"
                )
            self.progress.note(
                f"round {r} {target:8s} {clients:3d} clients {mode_name(stream):14s} "
                f"p50 {made.p50_ms:7.2f} ms p99 {made.p99_ms:7.2f} ms {made.req_per_s:7.0f} req/s "
                f"{made.cpu_ms_per_call:6.2f} ms CPU/call "
                f"(client {made.client_cpu_ms_per_call:4.2f}) "
                f"machine {made.machine_busy:4.0%} busy, {got.errors} errors"
            )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    # A SIGTERM (a timeout) unwinds like an error, so the servers started are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    now = datetime.now(UTC)
    cells = len(args.concurrency) * len(FIXED) + (len(SERVED) if args.vllm else 0)
    steps = 2 + args.rounds * cells * len(MODES)
    progress = Progress(steps)

    def body(bootstrap: str) -> tuple[Run, GatewayReport]:
        run = Run(args, bootstrap, progress)
        report = GatewayReport(
            **rounds_heading(PROG, argv, args, now, ""),
            seconds=args.seconds,
            served_seconds=args.served_seconds if args.vllm else None,
            warmup_s=args.warmup,
            concurrency=args.concurrency,
            litellm=f"{litellm_version()} (`litellm[proxy]`, dev/litellm.lock)",
        )
        with ExitStack() as stack:
            run.start(stack)
            run.rounds(report)
        return run, report

    done = on_broker(PROG, args, progress, body)
    if done is None:
        return 1
    (run, report), where = done
    report.broker = where
    report.notes += run.notes
    Results(args.results, now, "gateway", quick=args.quick).write(markdown(report), to_json(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
