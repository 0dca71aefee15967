"""Does an HTTP flood on the status endpoints slow the pipeline down?

    python -m bench.bench_http_flood [--bootstrap HOST:PORT] [--episodes 3000]
        [--rounds 3] [--clients 500]

One real ``stream-export worker`` (HTTP on, fresh topics, memory store) runs the
whole time. Each round produces ``--episodes`` new episodes to the steps topic
and times the drain: from the first event sent until every episode's record is
in the output files. Rounds alternate without and with a flood: ``--clients``
concurrent clients in a separate process (``flood`` below), each GETting
/metrics, /healthz, /readyz, /status.json and / on 127.0.0.1 in a loop for at
most ``--flood-max-s`` seconds. Prints min/median/max drain time of both and
the ratios (of the medians, of the best rounds, and the median ratio of each flood
round to the round before it, which cancels slow drifts of a shared machine), the
worker's CPU seconds per drain, and how many requests the flood got answered.

Nothing here runs in the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from stream_export.kafka import topics
from stream_export.ops.http import PATHS
from stream_export.settings import load
from tests.support.producer import produce
from tests.support.traffic import disorder


async def _flood(url: str, clients: int, max_s: float) -> None:
    """``clients`` concurrent GET loops against ``url`` (127.0.0.1 only), bounded in time."""
    import aiohttp

    assert url.startswith("http://127.0.0.1:"), "the flood only targets this machine"
    deadline = time.monotonic() + max_s
    answered = failed = 0
    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def client(n: int) -> None:
            nonlocal answered, failed
            i = n
            while time.monotonic() < deadline:
                try:
                    async with session.get(url + PATHS[i % len(PATHS)]) as response:
                        await response.read()
                    answered += 1
                except (aiohttp.ClientError, TimeoutError):
                    failed += 1
                    await asyncio.sleep(0.05)
                i += 1

        stop = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set_result, None)
        tasks = [asyncio.ensure_future(client(n)) for n in range(clients)]
        began = time.monotonic()
        await asyncio.wait([stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    took = time.monotonic() - began
    print(f"flood {answered} answered, {failed} failed, {answered / took:.0f}/s", flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _records(out: Path) -> int:
    return sum(p.read_bytes().count(b"\n") for p in out.glob("training-data*.jsonl"))


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _wait(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    p.add_argument("--episodes", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=3, help="rounds of each kind")
    p.add_argument("--clients", type=int, default=500)
    p.add_argument("--flood-max-s", type=float, default=120.0)
    args = p.parse_args()
    if not args.bootstrap:
        raise SystemExit("give --bootstrap or KAFKA_BOOTSTRAP_SERVERS")
    token = uuid.uuid4().hex[:8]
    work = Path(tempfile.mkdtemp(prefix="bench-http-"))
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    sets = [
        f"kafka.bootstrap_servers={args.bootstrap}",
        f"topics.steps=bench-{token}-steps",
        f"topics.episodes=bench-{token}-episodes",
        f"topics.dead_letters=bench-{token}-dlq",
        "topics.partitions=4",
        f"worker.app_id=bench-{token}",
        "worker.store=memory://",
        f"worker.data_dir={work / 'state'}",
        f"sink.output_dir={work / 'out'}",
        f"http.port={port}",
    ]
    settings = load(env={}, overrides=sets)
    asyncio.run(topics.ensure(settings))
    flags = [arg for s in sets for arg in ("--set", s)]
    with (work / "worker.log").open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "stream_export", "worker", *flags],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait(lambda: _ready(url), 120, "the worker to be ready")
        times: dict[bool, list[float]] = {False: [], True: []}
        cpus: dict[bool, list[float]] = {False: [], True: []}
        for r in range(2 * args.rounds):
            flooded = r % 2 == 1
            plan = disorder(args.episodes, seed=1000 + r, unended=0.0, duplicates=0.0)
            want = _records(work / "out") + args.episodes
            flood = None
            if flooded:
                flood = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "bench.bench_http_flood",
                        "flood",
                        url,
                        str(args.clients),
                        str(args.flood_max_s),
                    ],
                )
                time.sleep(2.0)  # let every client connect and loop
            began, cpu = time.monotonic(), _cpu_s(worker.pid)
            asyncio.run(produce(args.bootstrap, settings.topics.steps, plan.messages))
            _wait(lambda: _records(work / "out") >= want, 600, f"{want} records")  # noqa: B023
            took, cpu = time.monotonic() - began, _cpu_s(worker.pid) - cpu
            if flood is not None:
                flood.send_signal(signal.SIGTERM)
                flood.wait(60)
            times[flooded].append(took)
            cpus[flooded].append(cpu)
            label = f"with {args.clients}-client flood" if flooded else "without flood"
            print(
                f"round {r + 1}: {args.episodes} episodes drained in {took:.2f}s "
                f"(worker CPU {cpu:.2f}s) {label}",
                flush=True,
            )
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(60)
    for flooded, values in times.items():
        print(
            f"{'flood   ' if flooded else 'no flood'} drain s: min {min(values):.2f} "
            f"median {statistics.median(values):.2f} max {max(values):.2f}; "
            f"worker CPU s median {statistics.median(cpus[flooded]):.2f}"
        )
    ratio = statistics.median(times[True]) / statistics.median(times[False])
    best = min(times[True]) / min(times[False])
    pairs = statistics.median(f / n for f, n in zip(times[True], times[False], strict=True))
    print(
        f"ratio flood/no flood: medians {ratio:.2f}, best rounds {best:.2f}, median of "
        f"each flood round over the round before it {pairs:.2f} (bar: at most 1.25); "
        f"logs in {work}"
    )


if __name__ == "__main__":
    if sys.argv[1:2] == ["flood"]:
        asyncio.run(_flood(sys.argv[2], int(sys.argv[3]), float(sys.argv[4])))
    else:
        main()
