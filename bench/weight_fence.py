"""The weight fence under load, side by side with vLLM's own pause/resume (never in CI).

    python -m bench.weight_fence [--bootstrap HOST:PORT] [--agents 64] [--rounds 3]

Starts a vLLM of its own in dev mode (dev/vllm start --dev) and one gateway
(weights.enabled) in front of it, then in alternating rounds, with ``--agents``
closed-loop agents calling all the time:

  fence   agents call through the gateway; the trainer runs
          ``WeightFence.update(v)`` around ``weights.vllm.load`` (a new checkpoint)
  direct  agents call vLLM directly; the trainer runs ``weights.vllm.load`` alone
          (vLLM's pause?mode=wait, reload, reset_prefix_cache, resume)

For each: the update's time (fence: begin to commit, the load included; direct:
the load), the longest call that overlapped it against the calls' median (how long
agents waited), calls not answered 200, and, through the gateway, calls answered
but not on the steps topic (lost to the fence: must be 0). Prints Markdown and
writes bench/results/weights-<date>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp

from stream_export import settings as config
from stream_export.contract.decoding import decode_event
from stream_export.contract.events import Step
from stream_export.settings import Settings
from stream_export.weights import WeightFence, vllm
from tests.support.checkpoints import perturbed
from tests.support.monitoring import free_port
from tests.support.topic_reader import read_topic
from tests.support.vllm_server import dev_vllm
from tests.support.weight_fleet import Replica

#: One call: when it began and ended (time.monotonic()), its status (0: no answer).
Call = tuple[float, float, int]
RESULTS = Path(__file__).resolve().parent / "results"
BODY = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "What is the weather in Oslo today?"}],
    "max_tokens": 8,
}


@dataclass
class Outcome:
    mode: str
    round: int
    update_s: float
    calls: int
    median_call_s: float
    longest_overlapping_s: float
    not_200: int
    lost: int | None = None
    steps_s: dict[str, float] = field(default_factory=dict)


async def agent(
    http: aiohttp.ClientSession,
    base: str,
    through_gateway: bool,
    stop: asyncio.Event,
    log: list[Call],
) -> str:
    """Call until ``stop``; the episode id its calls are recorded under (through
    the gateway), else ""."""
    url, episode = base + "/v1/chat/completions", ""
    if through_gateway:
        async with http.post(base + "/v1/episodes", json={"agent_id": "bench"}) as started:
            episode = (await started.json())["episode_id"]
        url = f"{base}/episodes/{episode}/v1/chat/completions"
    while not stop.is_set():
        began = time.monotonic()
        try:
            async with http.post(url, json=BODY) as answer:
                await answer.read()
                status = answer.status
        except (aiohttp.ClientError, TimeoutError):
            status = 0
        log.append((began, time.monotonic(), status))
    return episode


async def one(
    mode: str, number: int, args: argparse.Namespace, gateway: Replica, vllm_url: str, ckpt: Path
) -> Outcome:
    through = mode == "fence"
    base = gateway.url if through else vllm_url
    stop, log = asyncio.Event(), list[Call]()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as http:
        agents = [
            asyncio.create_task(agent(http, base, through, stop, log)) for _ in range(args.agents)
        ]
        await asyncio.sleep(args.warm_s)
        began = time.monotonic()
        if through:
            async with WeightFence(gateway.settings) as fence:
                serving = await fence.serving()
                version = (serving if isinstance(serving, int) else 0) + 1
                t0 = time.monotonic()
                async with fence.update(version):
                    loaded = await vllm.load(vllm_url, ckpt, version)
                update_s = time.monotonic() - t0
        else:
            loaded = await vllm.load(vllm_url, ckpt, f"direct-{number}")
            update_s = time.monotonic() - began
        ended = time.monotonic()
        await asyncio.sleep(args.warm_s)
        stop.set()
        episodes = set(await asyncio.gather(*agents))
    durations = [end - start for start, end, _ in log]
    overlapping = [end - start for start, end, _ in log if start < ended and end > began]
    outcome = Outcome(
        mode,
        number,
        update_s,
        len(log),
        statistics.median(durations),
        max(overlapping, default=0.0),
        sum(status != 200 for *_, status in log),
        steps_s=loaded.seconds,
    )
    if through:
        answered = sum(status == 200 for *_, status in log)
        recorded = await asyncio.to_thread(recorded_calls, gateway.settings, episodes)
        outcome.lost = answered - recorded
    return outcome


def recorded_calls(settings: Settings, episodes: set[str]) -> int:
    """The llm_call steps of ``episodes`` on the steps topic."""
    records = read_topic(
        settings.kafka.bootstrap_servers, settings.topics.steps, count=1, timeout=120, settle=3
    )
    steps = [decode_event(r.value) for r in records]
    return sum(
        1
        for s in steps
        if isinstance(s, Step) and s.kind == "llm_call" and s.episode_id in episodes
    )


def markdown(outcomes: list[Outcome], agents: int) -> str:
    lines = [
        f"Weight update under {agents} agents calling (one run, alternating rounds)",
        "",
        "| round | mode | update s | longest call over it s | median call s | calls | not 200"
        " | lost |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for o in outcomes:
        lost = "-" if o.lost is None else str(o.lost)
        lines.append(
            f"| {o.round} | {o.mode} | {o.update_s:.3f} | {o.longest_overlapping_s:.3f} | "
            f"{o.median_call_s:.3f} | {o.calls} | {o.not_200} | {lost} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.weight_fence", description=__doc__)
    p.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    p.add_argument("--agents", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warm-s", type=float, default=3.0)
    args = p.parse_args()
    if not args.bootstrap:
        p.error("--bootstrap (or KAFKA_BOOTSTRAP_SERVERS) names the broker")
    paths = json.loads(dev_vllm("paths").stdout)
    model = Path(paths["model"])
    with tempfile.TemporaryDirectory(prefix="bench-weights-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "VLLM_STATE_DIR": str(work / "vllm")}
        started = dev_vllm("start", "--dev", env=env)
        if started.returncode != 0:
            raise SystemExit(started.stderr)
        vllm_url = dev_vllm("status", env=env).stdout.strip()
        token = uuid.uuid4().hex[:10]
        settings = config.load(
            env={},
            overrides=[
                f"kafka.bootstrap_servers={args.bootstrap}",
                f"topics.steps=bench-{token}-steps",
                f"weights.control_topic=bench-{token}-weights",
                "weights.enabled=true",
                "weights.max_hold_s=120",
                f"gateway.upstreams={vllm_url}/v1",
                f"gateway.port={free_port()}",
                f"gateway.state_dir={work / 'gateway'}",
                "gateway.max_open_episodes_per_key=100000",
            ],
        )
        gateway = Replica("bench", settings, work / "gateway.log").start()
        outcomes = []
        try:
            for number in range(1, args.rounds + 1):
                for mode in ("fence", "direct"):
                    ckpt = perturbed(model, work / f"{mode}-{number}", seed=number)
                    outcomes.append(asyncio.run(one(mode, number, args, gateway, vllm_url, ckpt)))
        finally:
            assert gateway.process is not None
            gateway.process.stop()
            dev_vllm("stop", env=env)
    text = markdown(outcomes, args.agents)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H%MZ")
    document: dict[str, Any] = {"agents": args.agents, "outcomes": [asdict(o) for o in outcomes]}
    (RESULTS / f"weights-{stamp}.json").write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
