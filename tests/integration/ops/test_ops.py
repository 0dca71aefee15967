"""The operator's view of a running worker under demo load: health and readiness,
/metrics, consumer lag, the live status page in headless Chromium, a real
Prometheus server scraping it (with the alert rules loaded), one-line JSON logs,
the endpoints served off the worker's event loop (a flood, a stuck loop), and
the probe port answering the kubelet at once while another client floods."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from stream_export.ops import http
from stream_export.settings import Settings, load
from tests.support.call_episodes import tool_episode
from tests.support.monitoring import (
    RULES,
    chromium,
    dom_text,
    exposed_names,
    free_port,
    get,
    get_json,
    referenced_names,
    tool,
)
from tests.support.probing import probes_under_flood
from tests.support.processes import STACKS, Worker, settings_args
from tests.support.sinkkafka import episode, message, prompts, publish
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

#: Demo load: episodes per second (about 8 events each) while the module's tests run.
RATE = 10


@dataclass
class Running:
    settings: Settings
    url: str
    worker: Worker

    @property
    def probe_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.http.probe_port}"

    def metrics(self) -> str:
        status, body = get(f"{self.url}/metrics")
        assert status == 200
        return body.decode()

    def sample(self, name: str) -> float:
        """Sum of a sample over its labels in the live exposition."""
        pattern = re.compile(rf"^{name}(?:{{[^}}]*}})? (\S+)$", re.M)
        return sum(float(v) for v in pattern.findall(self.metrics()))


@pytest.fixture(scope="module")
def running(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    token = uuid.uuid4().hex[:10]
    tmp = tmp_path_factory.mktemp("ops")
    port = free_port()
    settings = load(
        env={},
        overrides=[
            f"kafka.bootstrap_servers={kafka_bootstrap}",
            f"topics.steps=t-{token}-steps",
            f"topics.episodes=t-{token}-episodes",
            f"topics.dead_letters=t-{token}-dlq",
            "topics.partitions=2",
            f"worker.app_id=t-{token}-app",
            "worker.store=memory://",
            f"worker.data_dir={tmp / 'state'}",
            "worker.log_json=true",
            f"sink.output_dir={tmp / 'out'}",
            "http.enabled=true",
            f"http.port={port}",
            f"http.probe_port={free_port()}",
            "groups.enabled=true",  # the groups stage's metrics and status panel, live
        ],
    )
    url = f"http://127.0.0.1:{port}"
    with Worker(settings, tmp / "worker.log") as worker:
        wait_for(
            lambda: get(f"{url}/readyz")[0] == 200,
            timeout=90,
            what=f"/readyz 200\n{worker.log()[-3000:]}",
        )
        demo_load = ["--rate", str(RATE), "--count", str(RATE * 170), "--seed", "3"]
        demo = subprocess.Popen(
            [sys.executable, "-m", "stream_export", "demo", *settings_args(settings), *demo_load],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            yield Running(settings, url, worker)
        finally:
            demo.terminate()
            demo.wait(10)


def test_alive_and_ready_with_every_check(running: Running) -> None:
    assert get_json(f"{running.url}/healthz") == {"status": "alive"}
    assert get_json(f"{running.url}/readyz") == {
        "ready": True,
        "checks": {
            "partitions_assigned": True,
            "state_recovered": True,
            "output_writable": True,
            "kafka_reachable": True,
            "uploads_flowing": True,
        },
    }


def test_metrics_count_the_load_and_lag_per_partition(running: Running) -> None:
    wait_for(
        lambda: running.sample("stream_export_records_written_total") > 0,
        timeout=60,
        what="records written",
    )
    assert running.sample("stream_export_events_consumed_total") > 0
    assert running.sample("stream_export_episodes_emitted_total") > 0
    topics = running.settings.topics

    def lag_partitions(topic: str) -> set[str]:
        found = re.findall(
            rf'stream_export_consumer_lag_messages{{partition="(\d)",topic="{topic}"}}',
            running.metrics(),
        )
        return set(found) if len(set(found)) == 2 else set()

    # the assembler's lag on the steps topic, the sink's on the episodes topic
    for topic in (topics.steps, topics.episodes):
        got = wait_for(partial(lag_partitions, topic), timeout=30, what=f"lag on {topic}")
        assert got == {"0", "1"}
    text = running.metrics()
    assert 'stream_export_build_info{version="' in text
    assert running.sample("process_resident_memory_bytes") > 10_000_000
    assert running.sample("process_open_fds") > 0
    # labelled counters exist before their first increment
    assert re.search(r'^stream_export_sink_errors_total{kind="no_space"} 0\.0$', text, re.M)


def test_dashboard_and_rules_name_only_live_metrics(running: Running) -> None:
    wait_for(
        lambda: running.sample("stream_export_events_consumed_total") > 0,
        timeout=60,
        what="load",
    )
    live = exposed_names(running.metrics())
    missing = referenced_names() - live
    assert not missing, f"queried but not exposed by a live worker: {sorted(missing)}"


#: (weight version, rewards of its group): the learning curve the page must plot.
CURVE = ((0, (0.0, 0.5)), (1, (0.5, 1.0)), (2, (1.0, 1.0)))


def publish_versioned_groups(settings: Settings) -> None:
    """One group of two rollouts per version of CURVE, each rollout's calls served
    by that version (the demo's rollouts make no model calls: no version)."""
    token, now = uuid.uuid4().hex[:8], time.time()
    rollouts = [
        msgspec.structs.replace(
            tool_episode(f"curve-{token}-{v}-{i}", versions=(v, v), reward=r, offset=i),
            group_id=f"curve-{token}-{v}",
            group_size=2,
            start_time=now - 2,
            end_time=now,
        )
        for v, rewards in CURVE
        for i, r in enumerate(rewards)
    ]
    publish(settings, [message(e) for e in rollouts])


def test_status_page_shows_live_numbers_in_chromium(running: Running, tmp_path: Path) -> None:
    def busy() -> Any:
        status = get_json(f"{running.url}/status.json")
        return (
            status
            and status["throughput"]["events_per_s"] > 0
            and {row["topic"] for row in status["lag"]} >= lagging
            and status["groups"]["rollouts"] > 0
            and len(status["groups"]["reward_curve"]) == len(CURVE)
        )

    publish_versioned_groups(running.settings)

    # the assembler's and the sink's lag are measured on their own timers
    lagging = {running.settings.topics.steps, running.settings.topics.episodes}
    wait_for(busy, timeout=60, what="throughput, both stages' lag and group rollouts")
    done = chromium("--dump-dom", f"{running.url}/", profile=tmp_path / "profile-dom")
    dom = done.stdout
    assert done.returncode == 0 and "<body" in dom, done.stderr[-2000:]
    updates = re.search(r'<body data-updates="(\d+)"', dom)
    assert updates and int(updates.group(1)) >= 1, "the page never loaded /status.json"
    assert dom_text(dom, "ready") == "ready"
    assert float(dom_text(dom, "events_per_s").replace(",", "")) > 0
    assert float(dom_text(dom, "records_written").replace(",", "")) > 0
    assert running.settings.topics.steps in dom  # the lag table
    assert running.settings.topics.episodes in dom
    assert dom_text(dom, "worker_id") == running.settings.worker.worker_id
    # humanised, both lags, sealed files, disk space, links
    assert re.fullmatch(r"\d+ (s|min( \d+ s)?)", dom_text(dom, "uptime"))
    assert re.fullmatch(r"[\d.]+ (B|KiB|MiB)/s", dom_text(dom, "bytes_per_s"))
    assert re.fullmatch(r"[\d.]+ (B|KiB|MiB) since start", dom_text(dom, "bytes_written"))
    assert dom_text(dom, "lag_assemble").replace(",", "").isdigit()
    assert dom_text(dom, "lag_sink").replace(",", "").isdigit()
    assert dom_text(dom, "sealed_files") == "0" and dom_text(dom, "sealed_detail") == "none yet"
    assert re.fullmatch(r"[\d.]+ (MiB|GiB|TiB)", dom_text(dom, "disk_free"))
    assert dom_text(dom, "disk_detail").endswith("% used)")  # and no path
    # previews are off by default: no record, no path of the output on the page
    out = Path(running.settings.sink.output_dir).resolve()
    assert str(out) not in dom and "off: previews show episode ids" in dom
    assert (
        '"prompt"' not in dom and get_json(f"{running.url}/status.json")["recent_records"] is None
    )
    # groups enabled: the groups panel shows the stage's live numbers
    assert '<section id="groups">' in dom
    assert dom_text(dom, "groups_open").replace(",", "").isdigit()
    assert re.fullmatch(
        r"[1-9][\d,]* rollouts, [\d,]+ duplicate, [\d,]+ truncated",
        dom_text(dom, "groups_rollouts"),
    )
    for card in ("groups_closed", "groups_incomplete", "groups_zero_variance", "groups_late"):
        assert dom_text(dom, card).replace(",", "").isdigit(), card
    # the learning curve: the mean reward of each version's rollouts, as the worker closed them
    curve = get_json(f"{running.url}/status.json")["groups"]["reward_curve"]
    assert curve == [
        {"version": v, "mean_reward": sum(r) / len(r), "rollouts": len(r)} for v, r in CURVE
    ]
    points = re.findall(
        r'<circle [^>]*cy="([\d.]+)"[^>]*data-version="(\d+)" data-mean="([\d.]+)"', dom
    )
    assert [(v, float(m)) for _, v, m in points] == [("0", 0.25), ("1", 0.75), ("2", 1.0)]
    heights = [float(y) for y, _, _ in points]
    assert heights[0] > heights[1] > heights[2]  # rising reward: higher on the page
    assert dom_text(dom, "reward_detail") == "3 versions; v2: 1.00 over 2 rollouts"
    assert re.search(r'<a id="link-metrics" href="metrics">/metrics</a>', dom)
    assert re.search(r'<a id="link-readyz" href="readyz">/readyz</a>', dom)
    assert dom_text(dom, "error_window") == "(last 5 min / since start)"

    shot = tmp_path / "status.png"
    done = chromium(f"--screenshot={shot}", f"{running.url}/", profile=tmp_path / "profile-png")
    assert done.returncode == 0, done.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert (int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")) == (1280, 900)


@pytest.fixture
def prometheus(running: Running, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    target = running.url.removeprefix("http://")
    (tmp_path / "prometheus.yml").write_text(
        json.dumps(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {"job_name": "stream-export", "static_configs": [{"targets": [target]}]}
                ],
            }
        )
    )
    with (tmp_path / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                tool("prometheus"),
                f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(
            lambda: get(f"{url}/-/ready")[0] == 200,
            timeout=30,
            what=f"Prometheus ready\n{(tmp_path / 'prometheus.log').read_text()[-2000:]}",
        )
        yield url
    finally:
        proc.terminate()
        proc.wait(20)


def test_prometheus_scrapes_throughput_and_evaluates_the_rules(prometheus: str) -> None:
    def throughput() -> float:
        query = "sum(rate(stream_export_events_consumed_total[5s]))"
        answer = get_json(f"{prometheus}/api/v1/query?query={query.replace(' ', '%20')}")
        result = answer["data"]["result"] if answer else []
        return float(result[0]["value"][1]) if result else 0.0

    events_per_s = wait_for(throughput, timeout=60, what="a throughput series in Prometheus")
    assert 0 < events_per_s < 100 * RATE

    targets = get_json(f"{prometheus}/api/v1/targets")["data"]["activeTargets"]
    assert [t["health"] for t in targets] == ["up"]

    def evaluated() -> list[dict[str, Any]]:
        groups = get_json(f"{prometheus}/api/v1/rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        return (
            rules
            if rules and all(r.get("lastEvaluation", "").startswith("2") for r in rules)
            else []
        )

    rules = wait_for(evaluated, timeout=30, what="the alert rules evaluated")
    assert {r["health"] for r in rules} == {"ok"}, [r.get("lastError") for r in rules]
    firing = {r["name"] for r in rules if r["state"] == "firing"}
    assert not firing & {"StreamExportWorkerDown", "StreamExportWorkersAbsent"}


def test_logs_are_one_json_object_per_line_without_record_contents(running: Running) -> None:
    wait_for(
        lambda: running.sample("stream_export_records_written_total") > 0,
        timeout=60,
        what="records written",
    )
    lines = running.worker.log().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("{"))
    events = [json.loads(line) for line in lines[first:] if line.strip()]
    assert all({"ts", "level", "logger", "msg"} <= e.keys() for e in events)
    h = running.settings.http
    assert any(
        e["msg"] == "http.started" and (e["port"], e["probe_port"]) == (h.port, h.probe_port)
        for e in events
    )
    assert any(e["msg"] == "worker.ready" for e in events)
    # the demo prompts and completions never reach the log
    assert not any("Think step by step" in line or "dark room" in line for line in lines)


async def flood(url: str, clients: int, rounds: int) -> list[tuple[str, int, bytes]]:
    """``clients`` concurrent clients, each GETting every endpoint ``rounds`` times:
    (path, status, body) in the order they were answered."""
    answers: list[tuple[str, int, bytes]] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:

        async def client() -> None:
            for _ in range(rounds):
                for path in http.PATHS:
                    async with session.get(url + path) as response:
                        answers.append((path, response.status, await response.read()))

        async with asyncio.timeout(60):
            await asyncio.gather(*(client() for _ in range(clients)))
    return answers


def test_endpoints_answer_a_flood_while_the_worker_keeps_writing(running: Running) -> None:
    records = re.compile(rb"^stream_export_records_written_total (\S+)$", re.M)
    before = running.sample("stream_export_records_written_total")
    answers = asyncio.run(flood(running.url, clients=30, rounds=2))
    assert len(answers) == 30 * 2 * len(http.PATHS)
    assert {status for _, status, _ in answers} == {200}
    bodies: dict[str, list[bytes]] = {}
    for path, _, body in answers:
        bodies.setdefault(path, []).append(body)
    assert {json.loads(b)["status"] for b in bodies["/healthz"]} == {"alive"}
    assert {json.loads(b)["ready"] for b in bodies["/readyz"]} == {True}
    worker_id = running.settings.worker.worker_id
    assert {json.loads(b)["worker_id"] for b in bodies["/status.json"]} == {worker_id}
    assert all(b'id="events_per_s"' in b for b in bodies["/"])
    written = [float(records.search(b)[1]) for b in bodies["/metrics"]]  # type: ignore[index]
    assert max(written) > before, "no record was written during the flood"


def test_probes_answer_within_a_second_while_another_client_floods(running: Running) -> None:
    """Issue 25: another client floods /healthz and /readyz on both ports; every
    kubelet probe on the probe port is answered within 1 s, alive and ready."""
    try:
        answers, (main, own) = asyncio.run(
            probes_under_flood(
                [running.url, running.probe_url], running.probe_url, rate=20, warm_up_s=1, probes=12
            )
        )
        # the flood outran the main port's shared budget, and its own on the probe port
        assert main.timed_out > 0 and own.timed_out > 0, (main, own)
        late = [a for a in answers if a.status != 200 or a.took_s >= 1.0]
        assert not late, late
        assert {a.body for a in answers if a.path == "/healthz"} == {b'{"status":"alive"}'}
        assert {json.loads(a.body)["ready"] for a in answers if a.path == "/readyz"} == {True}
    finally:  # the flood's abandoned requests still hold turns on the main port
        wait_for(
            lambda: get(f"{running.url}/readyz", timeout=1)[0] == 200,
            timeout=60,
            interval=1,
            what="the main port answering again after the flood",
        )


def test_endpoints_are_served_off_the_worker_loop(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """The sink's formatter holds the worker loop for 12 s: /metrics still answers at
    once, /healthz and /readyz turn 503, and both recover when the loop does."""
    port = free_port()
    settings = settings_for(
        "http.enabled=true",
        f"http.port={port}",
        "format.format=tests.support.slow_format:record",
    )
    url = f"http://127.0.0.1:{port}"
    with Worker(settings, tmp_path / "worker.log") as worker:
        wait_for(lambda: get(f"{url}/readyz")[0] == 200, timeout=90, what=f"ready\n{worker.log()}")
        publish(settings, [message(episode(0, metadata={"block_s": 12}))])
        wait_for(
            lambda: get(f"{url}/healthz")[0] == 503,
            timeout=30,
            what="/healthz 503 while the loop is held",
        )
        status, body = get(f"{url}/healthz")
        assert status == 503 and json.loads(body)["status"] == "stuck"
        assert json.loads(body)["silent_s"] >= http.STALE_S
        status, body = get(f"{url}/readyz")
        assert status == 503 and json.loads(body)["ready"] is False
        began = time.monotonic()
        status, body = get(f"{url}/metrics")
        assert status == 200 and b"stream_export_build_info" in body
        assert time.monotonic() - began < 1.0
        # kill -QUIT prints every thread's stack, the held loop's too, and the worker goes on.
        assert worker.proc is not None
        os.kill(worker.proc.pid, signal.SIGQUIT)
        held = re.compile(r'slow_format\.py", line \d+ in record')
        wait_for(
            lambda: held.search(worker.log()),
            timeout=10,
            what=f"the held loop's stack\n{worker.log()[-3000:]}",
        )
        assert STACKS in worker.log() and worker.alive()
        out = tmp_path / "out"
        wait_for(lambda: prompts(out) == {"task 0": 1}, timeout=30, what="the record written")
        wait_for(lambda: get(f"{url}/healthz")[0] == 200, timeout=10, what="/healthz 200 again")
        assert get_json(f"{url}/readyz")["ready"] is True

        clients = [
            threading.Thread(target=lambda: [get(f"{url}/metrics") for _ in range(20)])
            for _ in range(50)
        ]
        for client in clients:
            client.start()
        began = time.monotonic()
        assert worker.stop(timeout=30) == 0
        assert time.monotonic() - began < 15, "SIGTERM under a flood did not stop the worker"
        for client in clients:
            client.join(30)
    assert "http.stopped thread_alive=false" in worker.log()
