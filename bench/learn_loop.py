"""The live loop on the log side by side with TRL's in-process GRPOTrainer (never in CI).

    python -m bench.learn_loop [--bootstrap HOST:PORT] [--vllm URL] [--rounds 2]

One run, the same toy task (a digit among the first four completion tokens; a fresh
five-word prompt per group, 8 rollouts each, 4 groups a step), the same tiny model,
on this machine, in alternating rounds:

  loop  ``stream-export learn`` with its defaults: agents on the OpenAI SDK through a
        gateway (weight fence, ``max_feed_lag`` 4) to a vLLM in dev mode, a worker
        closing groups, the reference trainer (decoupled loss) taking them from the
        feed, fencing and loading each version into vLLM; a fresh worker, gateway
        and topics per round
  trl   TRL 1.16's own GRPOTrainer, generating in process on CPU (bench/learn_trl.py,
        in dev/trainers' environment)
  fed   the loop's trainer alone, on a feed already holding the groups the loop's
        round published (generation not the bottleneck): at most 10 steps, each
        saved, fenced and loaded into vLLM as in the loop
  vllm  4 steps' worth of the agents' calls straight to vLLM, 32 at a time: the
        generation rate without the gateway, the worker and the trainer

For loop and TRL: wall time from launching the process to its exit at the target
mean reward (0.8; the loop: over one version's >= 32 rollouts, TRL: over one step's
32), and trainer steps to it. From the trainer's log lines (loop and fed): its idle
fraction (seconds waiting for the feed over all its seconds; fed: after its first
batch, whose wait is joining the consumer group) and rollouts per second (rollouts
trained over the trainer's seconds). For the loop also a profile: median seconds of
a group's generation and close, its age when the trainer has it, the fence's phases,
and each process's CPU seconds. Without ``--vllm`` it starts a vLLM of its own in
dev mode (dev/vllm start --dev) and stops it at the end; with ``--vllm``, the CPU of
the vLLM whose dev/vllm state folder ``$VLLM_STATE_DIR`` names is counted. Results:
bench/results/<date>-learn.md and .json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from bench.report import (
    Bar,
    Heading,
    Spread,
    bar_table,
    cells,
    heading,
    page,
    results_json,
    results_option,
    round_ratios,
    row,
    spread,
    title,
)
from bench.report import Results as ResultFiles
from stream_export import settings as config
from stream_export.contract.decoding import decode_record
from stream_export.contract.groups import GroupRecord
from stream_export.contract.topics import topic_names
from stream_export.kafka import topics
from stream_export.learn.command import trainer_command
from stream_export.learn.ledger import reward_curve
from stream_export.learn.tasks import prompts
from tests.support.monitoring import free_port, get
from tests.support.processes import Gateway, Worker, dev_tool, settings_args
from tests.support.topic_reader import end_offsets, read_topic
from tests.support.vllm_server import dev_vllm
from tests.support.waiting import wait_for

#: ``fed``: the loop's trainer alone on a feed that already holds the groups the
#: loop's round published (generation not the bottleneck).
#: ``vllm``: the loop's calls straight to vLLM, without the chain.
SYSTEMS = ("loop", "trl", "fed", "vllm")
#: Steps' worth of calls the ``vllm`` run makes.
DIRECT_STEPS = 4
#: Steps the ``fed`` trainer takes at most (it needs a batch more on the topic).
FED_STEPS = 10
PHASES = (
    "start_s",
    "build_s",
    "first_s",
    "generate_s",
    "close_s",
    "age_s",
    "hold_s",
    "load_s",
    "commit_s",
    "end_s",
)
GROUP_SIZE, GROUPS_PER_STEP, MAX_FEED_LAG = 8, 4, 4
BAR_RATIO, BAR_IDLE = 1.5, 0.10


class Outcome(msgspec.Struct, kw_only=True):
    system: str
    round: int
    reached: bool
    wall_s: float
    steps: int
    #: The loop only: the trainer's seconds waiting for the feed over all its seconds.
    idle: float | None = None
    #: The loop only: rollouts trained over the trainer's seconds.
    rollouts_per_s: float | None = None
    #: The loop only: the trainer's median seconds per step waiting, stepping, fencing.
    per_step_s: dict[str, float] | None = None
    #: TRL only: seconds from train() to the target, without imports and model load.
    train_s: float | None = None
    #: CPU seconds of each process over the run (the loop: agents, trainer, worker,
    #: gateway, vllm; TRL: trl).
    cpu_s: dict[str, float] | None = None
    #: The loop only: median seconds of a group's phases (``group_phases``) and of the
    #: trainer's fence (holding the gateways, loading into vLLM, committing).
    profile: dict[str, float] | None = None
    #: The loop only: calls the gateway refused over a lag (429, max_feed_lag).
    throttled: int | None = None
    #: The loop only: [version, mean reward, rollouts] the command printed.
    curve: list[tuple[int, float, int]] | None = None


class Report(Heading, kw_only=True):
    rounds: int
    target: float
    outcomes: list[Outcome]


# -- parsing (pure) ---------------------------------------------------------------


def json_lines(text: str, key: str) -> list[dict[str, Any]]:
    """The JSON objects among ``text``'s lines that hold ``key`` (logs mix in prose)."""
    out = []
    for line in text.splitlines():
        if line.startswith("{") and key in line:
            try:
                got = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(got, dict) and key in got:
                out.append(got)
    return out


def trainer_seconds(lines: Iterable[dict[str, Any]]) -> tuple[float, float]:
    """(seconds waiting for the feed, seconds in all) over the trainer's step lines."""
    waited = busy = 0.0
    for line in lines:
        waited += line["waited_s"]
        busy += sum(line.get(key, 0.0) for key in ("step_s", "fence_s", "ack_s"))
    return waited, waited + busy


def idle_fraction(lines: list[dict[str, Any]]) -> float:
    waited, total = trainer_seconds(lines)
    return waited / total if total else 0.0


def steady(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trainer's lines after its first batch (whose wait is the feed joining its
    consumer group and reading back, not waiting for rollouts)."""
    return lines[1:]


def median_of(lines: Iterable[dict[str, Any]], key: str) -> float | None:
    values = [line[key] for line in lines if line.get(key) is not None]
    return statistics.median(values) if values else None


def group_phases(groups: Iterable[GroupRecord]) -> dict[str, float]:
    """Median seconds, over closed groups, of generating one (first rollout's start
    to last rollout's end, gateway clock) and of closing it (last end to the
    worker's close)."""
    generate, close = [], []
    for group in groups:
        if not group.rollouts:
            continue
        ended = max(e.end_time for e in group.rollouts)
        generate.append(ended - min(e.start_time for e in group.rollouts))
        close.append(group.closed_at - ended)
    if not generate:
        return {}
    return {"generate_s": statistics.median(generate), "close_s": statistics.median(close)}


def cpu_seconds(pid: int, proc: Path = Path("/proc")) -> float:
    """CPU seconds (user + system) of ``pid`` and its live descendants, from /proc."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        parents[int(entry.name)] = int(fields[1])
        times[int(entry.name)] = (int(fields[11]) + int(fields[12])) / tick
    tree, total = [pid], 0.0
    while tree:
        at = tree.pop()
        total += times.get(at, 0.0)
        tree += [child for child, parent in parents.items() if parent == at]
    return total


def process_cpu(lines: list[dict[str, Any]]) -> float:
    """The trainer's CPU seconds from its lines' ``cpu_s`` (its process's so far): the
    last line of each process, a restarted one starting again from 0."""
    ends = [
        float(line["cpu_s"])
        for line, after in zip(lines, [*lines[1:], {}], strict=False)
        if "cpu_s" in line and after.get("cpu_s", 0.0) < line["cpu_s"]
    ]
    return sum(ends)


def children_cpu() -> float:
    """CPU seconds of this process's children that ended and were waited for."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def per_step(lines: list[dict[str, Any]]) -> dict[str, float]:
    """The median seconds of the trainer's steps waiting, stepping, fencing and
    acknowledging."""
    stepped = [line for line in lines if "step_s" in line]
    return {
        key: statistics.median(line[key] for line in stepped) if stepped else 0.0
        for key in ("waited_s", "step_s", "fence_s", "ack_s")
    }


def steps_to(ledger: list[dict[str, Any]], target: float, window: int) -> int:
    """Trainer steps to the target counted as TRL counts them: the updates before the
    first version whose >= ``window`` rollouts reach ``target``, plus the one on its
    batch (TRL logs a step's reward after stepping on it; the loop stops before); the
    last version when none reached it."""
    curve = reward_curve(r for entry in ledger for r in entry["rollouts"])
    reached = [v for v, (mean, count) in curve.items() if count >= window and mean >= target]
    if reached:
        return min(reached) + 1
    return max((int(e["version"]) for e in ledger), default=0)


def rollouts_trained(ledger: Iterable[dict[str, Any]]) -> int:
    return sum(len(entry["rollouts"]) for entry in ledger if entry.get("stepped"))


def reached_at(lines: Iterable[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """TRL's first step line whose reward reaches ``target``."""
    return next((line for line in lines if line["reward"] >= target), None)


def system_spreads(outcomes: list[Outcome], field: str) -> dict[str, Spread]:
    """System -> min / median / max of ``field`` over its rounds that reached the target."""
    out = {}
    for system in SYSTEMS:
        values = [
            getattr(o, field)
            for o in outcomes
            if o.system == system and o.reached and getattr(o, field) is not None
        ]
        if values:
            out[system] = spread(values)
    return out


# -- the runs ---------------------------------------------------------------------


def loop_settings(args: argparse.Namespace, token: str, here: Path) -> config.Settings:
    return config.load(
        env={},
        overrides=[
            f"kafka.bootstrap_servers={args.bootstrap}",
            f"topics.steps=bench-{token}-steps",
            f"topics.episodes=bench-{token}-episodes",
            f"topics.dead_letters=bench-{token}-dlq",
            "topics.partitions=2",
            f"worker.app_id=bench-{token}-app",
            "worker.store=memory://",
            f"worker.data_dir={here / 'worker'}",
            f"sink.output_dir={here / 'out'}",
            "http.enabled=true",  # the worker's /readyz (the gateway has its own port)
            f"http.port={free_port()}",
            "groups.enabled=true",
            "weights.enabled=true",
            f"weights.control_topic=bench-{token}-weights",
            "weights.lease_s=2",
            f"gateway.upstreams={args.vllm}/v1",
            f"gateway.port={free_port()}",
            f"gateway.state_dir={here / 'gateway'}",
            "gateway.feed_group=trainer",
            f"gateway.max_feed_lag={args.max_feed_lag}",
        ],
    )


def vllm_pid(state: Path) -> int | None:
    """The pid of the vLLM whose state folder is ``state`` (dev/vllm), if readable."""
    try:
        return int((state / "pid").read_text())
    except (OSError, ValueError):
        return None


def run_loop(
    args: argparse.Namespace, number: int, work: Path, model: Path, python: str
) -> tuple[Outcome, Outcome | None]:
    """One round of the loop, then (``fed``) a second trainer on the groups it left."""
    token = uuid.uuid4().hex[:10]
    here = work / f"loop-{number}"
    settings = loop_settings(args, token, here)
    here.mkdir(parents=True)
    asyncio.run(topics.ensure(settings))
    state = here / "learn"
    command = [
        sys.executable, "-m", "stream_export", "learn",
        "--model", str(model), "--vllm", args.vllm, "--state-dir", str(state),
        "--groups-per-step", str(GROUPS_PER_STEP), "--group-size", str(GROUP_SIZE),
        "--target", str(args.target), "--trainer-python", python, "--seed", str(number),
        *settings_args(settings),
    ]  # fmt: skip
    vllm = vllm_pid(args.vllm_state)
    with (
        Worker(settings, here / "worker.log") as worker,
        Gateway(settings, here / "gateway.log") as gateway,
    ):
        url = f"http://{gateway.settings.gateway.host}:{gateway.settings.gateway.port}"
        wait_for(lambda: get(url + "/healthz")[0] == 200, timeout=60, what="the gateway")
        # the worker runs already, as in production: its partitions assigned
        ready = f"http://{settings.http.host}:{settings.http.port}/readyz"
        wait_for(lambda: get(ready)[0] == 200, timeout=60, what="the worker")
        assert worker.proc is not None and gateway.proc is not None
        before = {
            "worker": cpu_seconds(worker.proc.pid),
            "gateway": cpu_seconds(gateway.proc.pid),
            "vllm": cpu_seconds(vllm) if vllm else 0.0,
            "children": children_cpu(),
        }
        began, launched = time.monotonic(), time.time()
        done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s)
        wall, ended = time.monotonic() - began, time.time()
        throttled = throttled_calls(get(url + "/metrics")[1].decode())
        learned = children_cpu() - before["children"]
        cpu = {
            "worker": cpu_seconds(worker.proc.pid) - before["worker"],
            "gateway": cpu_seconds(gateway.proc.pid) - before["gateway"],
        }
        if vllm:
            cpu["vllm"] = cpu_seconds(vllm) - before["vllm"]
        groups = published_groups(settings)
        fed = run_fed(args, number, token, here, settings, model, python, len(groups))
    lines = json_lines((state / "trainer.log").read_text(errors="replace"), "waited_s")
    ledger = json_lines((state / "ledger.jsonl").read_text(), "rollouts")
    _, seconds = trainer_seconds(lines)
    trainer_cpu = process_cpu(lines)
    cpu |= {"trainer": trainer_cpu, "agents": learned - trainer_cpu}
    if done.returncode != 0:
        print(
            f"loop round {number} exited {done.returncode}:\n{done.stderr[-3000:]}", file=sys.stderr
        )
    profile: dict[str, float] = {}
    if lines and "at" in lines[-1]:  # launch -> the first weights serve; last step -> exit
        profile["start_s"] = (state / "serving").stat().st_mtime - launched
        profile["end_s"] = ended - lines[-1]["at"]
    built = json_lines((state / "trainer.log").read_text(errors="replace"), "built_at")
    if built and lines:  # after the first weights serve: the model built, the first step
        serving = built[0]["serving_at"]
        profile["build_s"] = max(0.0, built[0]["built_at"] - serving)
        profile["first_s"] = lines[0]["at"] - serving
    profile |= group_phases(groups) | {
        key: value
        for key in ("age_s", "hold_s", "load_s", "commit_s")
        if (value := median_of(lines, key)) is not None
    }
    loop = Outcome(
        system="loop",
        round=number,
        reached=done.returncode == 0,
        wall_s=wall,
        steps=steps_to(ledger, args.target, GROUPS_PER_STEP * GROUP_SIZE),
        idle=idle_fraction(lines),
        rollouts_per_s=rollouts_trained(ledger) / seconds if seconds else None,
        per_step_s=per_step(lines),
        cpu_s={k: round(v, 2) for k, v in cpu.items()},
        profile={k: round(v, 3) for k, v in profile.items()},
        throttled=throttled,
        curve=[
            (c["version"], c["mean_reward"], c["rollouts"])
            for c in json_lines(done.stdout, "mean_reward")
        ],
    )
    return loop, fed


def throttled_calls(metrics: str) -> int:
    """Calls the gateway answered 429 over a lag, from its /metrics text."""
    prefix = 'stream_export_gateway_calls_total{endpoint="chat",outcome="throttled"} '
    found = [line for line in metrics.splitlines() if line.startswith(prefix)]
    return int(float(found[0].removeprefix(prefix))) if found else 0


def published_groups(settings: config.Settings) -> list[GroupRecord]:
    """Every group record the round's worker published."""
    topic = topic_names(settings.worker.app_id)[1]
    bootstrap = settings.kafka.bootstrap_servers
    count = sum(end_offsets(bootstrap, topic, settings.topics.partitions).values())
    return [
        decode_record(r.value)
        for r in read_topic(bootstrap, topic, count=count, timeout=60, settle=0.2)
        if r.value
    ]


def run_fed(
    args: argparse.Namespace,
    number: int,
    token: str,
    here: Path,
    settings: config.Settings,
    model: Path,
    python: str,
    published: int,
) -> Outcome | None:
    """The loop's trainer alone, on a feed (a consumer group of its own) that already
    holds the groups the loop's round published: generation is not the bottleneck.
    It steps, saves, fences (a control topic of its own, which no gateway follows) and
    loads each version into vLLM as in the loop; ``FED_STEPS`` steps at most, a batch
    fewer than the topic holds."""
    steps = min(FED_STEPS, published // GROUPS_PER_STEP - 1)
    if steps < 3:
        return None
    state = here / "fed"
    overrides = [
        *settings_args(settings),
        "--set",
        f"weights.control_topic=bench-{token}-fed-weights",
    ]
    command = trainer_command(
        python,
        [
            *("--model", str(model), "--vllm", args.vllm, "--state-dir", str(state)),
            *("--feed-group", f"fed-{uuid.uuid4().hex[:8]}"),
            *("--groups-per-step", str(GROUPS_PER_STEP), "--max-steps", str(steps)),
            *("--target", "2"),
            *overrides,
        ],
    )
    before = children_cpu()
    began = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s)
    wall = time.monotonic() - began
    if done.returncode != 3:  # 3: its last step
        print(
            f"fed round {number} exited {done.returncode}:\n{done.stderr[-3000:]}", file=sys.stderr
        )
        return None
    lines = json_lines(done.stdout, "waited_s")
    ledger = json_lines((state / "ledger.jsonl").read_text(), "rollouts")
    _, seconds = trainer_seconds(steady(lines))
    trained = rollouts_trained(ledger[1:])
    return Outcome(
        system="fed",
        round=number,
        reached=True,
        wall_s=wall,
        steps=len(ledger),
        idle=idle_fraction(steady(lines)),
        rollouts_per_s=trained / seconds if seconds else None,
        per_step_s=per_step(steady(lines)),
        cpu_s={"trainer": round(children_cpu() - before, 2)},
    )


async def _direct(url: str, model: str, rollouts: int) -> float:
    """Seconds for ``rollouts`` chat completions straight to vLLM, ``GROUPS_PER_STEP x
    GROUP_SIZE`` at a time, shaped as the agents' (12 tokens at temperature 1.0, logprobs;
    the gateway asks for token ids too)."""
    prompts = prompts_of(rollouts // GROUP_SIZE)
    body = {"model": model, "max_tokens": 12, "temperature": 1.0, "logprobs": True}
    body |= {"return_token_ids": True}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        queue = [p for p in prompts for _ in range(GROUP_SIZE)]

        async def player() -> None:
            while queue:
                messages = [{"role": "user", "content": queue.pop()}]
                async with http.post(
                    f"{url}/v1/chat/completions", json=body | {"messages": messages}
                ) as answer:
                    answer.raise_for_status()
                    await answer.read()

        began = time.monotonic()
        await asyncio.gather(*(player() for _ in range(GROUPS_PER_STEP * GROUP_SIZE)))
        return time.monotonic() - began


def prompts_of(count: int) -> list[str]:
    return [t["prompt"] for t in itertools.islice(prompts(None, 0), count)]


def run_direct(args: argparse.Namespace, number: int) -> Outcome:
    """vLLM alone: the loop's calls of a run straight to it, no gateway, worker or
    trainer (what generation costs without the chain)."""
    rollouts = DIRECT_STEPS * GROUPS_PER_STEP * GROUP_SIZE
    seconds = asyncio.run(_direct(args.vllm, "tiny", rollouts))
    return Outcome(
        system="vllm",
        round=number,
        reached=True,
        wall_s=seconds,
        steps=DIRECT_STEPS,
        rollouts_per_s=rollouts / seconds,
    )


def run_trl(args: argparse.Namespace, number: int, work: Path, model: Path, python: str) -> Outcome:
    script = Path(__file__).resolve().parent / "learn_trl.py"
    command = [
        python, str(script), "--model", str(model), "--out", str(work / f"trl-{number}"),
        "--target", str(args.target), "--seed", str(number),
    ]  # fmt: skip
    before = children_cpu()
    began = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s)
    wall = time.monotonic() - began
    cpu = children_cpu() - before
    lines = json_lines(done.stdout, "reward")
    at = reached_at(lines, args.target)
    if done.returncode != 0:
        print(
            f"trl round {number} exited {done.returncode}:\n{done.stderr[-3000:]}", file=sys.stderr
        )
    return Outcome(
        system="trl",
        round=number,
        reached=done.returncode == 0 and at is not None,
        wall_s=wall,
        steps=int(at["step"]) if at else len(lines),
        train_s=float(at["at_s"]) if at else None,
        cpu_s={"trl": round(cpu, 2)},
    )


# -- the report -------------------------------------------------------------------


def bars(outcomes: list[Outcome]) -> list[Bar]:
    walls = {(o.system, o.round): o.wall_s for o in outcomes if o.reached}
    ratio = round_ratios(walls, "loop", ["trl"]).get("loop / trl")
    idle = system_spreads(outcomes, "idle").get("fed")
    return [
        Bar(name="loop / TRL wall time to the reward", op="<=", target=BAR_RATIO, value=ratio),
        Bar(
            name="trainer idle fraction, generation not the bottleneck (fed)",
            op="<=",
            target=BAR_IDLE,
            value=idle,
        ),
    ]


def markdown(report: Report) -> str:
    lines = title("The live loop against TRL's GRPOTrainer", report)
    lines += [
        "",
        row(
            "round",
            "system",
            "reached",
            "wall s",
            "steps",
            "idle",
            "rollouts/s",
            "TRL train s",
            "loop step: median wait / step / fence / ack s",
        ),
        row(*["---"] * 9),
    ]
    for o in report.outcomes:
        lines.append(
            row(
                o.round,
                o.system,
                o.reached,
                f"{o.wall_s:.1f}",
                o.steps,
                "-" if o.idle is None else f"{o.idle:.3f}",
                "-" if o.rollouts_per_s is None else f"{o.rollouts_per_s:.2f}",
                "-" if o.train_s is None else f"{o.train_s:.1f}",
                "-"
                if o.per_step_s is None
                else " / ".join(f"{v:.2f}" for v in o.per_step_s.values()),
            )
        )
    lines += [
        "",
        row("figure (rounds that reached it)", *SYSTEMS),
        row(*["---"] * (len(SYSTEMS) + 1)),
    ]
    for field in ("wall_s", "steps", "idle", "rollouts_per_s", "train_s"):
        got = system_spreads(report.outcomes, field)
        lines.append(row(field, *(cells(got.get(s)) for s in SYSTEMS)))
    loops = [o for o in report.outcomes if o.system == "loop"]
    phases = sorted({k for o in loops for k in o.profile or {}}, key=PHASES.index)
    lines += [
        "",
        "The loop's phases, seconds: from launch until the first weights serve (start),",
        "from then until the trainer's model is built (build) and its first step is done",
        "(first), medians of a group's generation (first start to last end) and close (last end to",
        "the worker's close), its age when the trainer has it, the fence (holding the",
        "gateways, loading into vLLM, committing), and from the last step to the exit (end).",
        "",
        row("round", *phases, "calls throttled"),
        row(*["---"] * (len(phases) + 2)),
        *(
            row(o.round, *(f"{(o.profile or {}).get(k, 0):.3f}" for k in phases), o.throttled)
            for o in loops
        ),
    ]
    if loops and loops[0].curve:
        lines += [
            "",
            f"Learning curve of the loop's round {loops[0].round}: the mean reward of the "
            "rollouts each version served.",
            "",
            row("version", "mean reward", "rollouts"),
            row("---", "---", "---"),
            *(row(v, f"{mean:.3f}", n) for v, mean, n in loops[0].curve),
        ]
    names = sorted({k for o in report.outcomes for k in o.cpu_s or {}})
    lines += [
        "",
        "CPU seconds per process over each run (agents: the learn command's own).",
        "",
        row("round", "system", *names),
        row(*["---"] * (len(names) + 2)),
        *(
            row(o.round, o.system, *(f"{o.cpu_s[k]:.1f}" if k in o.cpu_s else "-" for k in names))
            for o in report.outcomes
            if o.cpu_s
        ),
    ]
    lines += ["", *bar_table(42, bars(report.outcomes))]
    return page(lines)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.learn_loop", description=__doc__)
    p.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS"))
    p.add_argument("--vllm", help="a vLLM in dev mode serving the tiny model (else its own)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--target", type=float, default=0.8)
    p.add_argument("--max-feed-lag", type=int, default=MAX_FEED_LAG, help="the loop's gateway's")
    p.add_argument("--timeout-s", type=float, default=900)
    p.add_argument("--work", help="a folder to keep the rounds' logs in (default: a temporary one)")
    results_option(p)
    args = p.parse_args()
    if not args.bootstrap:
        p.error("--bootstrap (or KAFKA_BOOTSTRAP_SERVERS) names the broker")
    now = datetime.now(UTC)
    model = Path(json.loads(dev_vllm("paths").stdout)["model"])
    found = dev_tool("trainers", "paths", timeout=60)
    if found.returncode != 0:
        p.error(found.stderr)
    python = json.loads(found.stdout)["trainers"]
    outcomes = []
    kept = contextlib.nullcontext(args.work) if args.work else None
    with kept or tempfile.TemporaryDirectory(prefix="bench-learn-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "VLLM_STATE_DIR": str(work / "vllm")}
        own = args.vllm is None
        if own:
            started = dev_vllm("start", "--dev", env=env)
            if started.returncode != 0:
                raise SystemExit(started.stderr)
            args.vllm = dev_vllm("status", env=env).stdout.strip()
        args.vllm_state = Path(
            env["VLLM_STATE_DIR"] if own else os.environ.get("VLLM_STATE_DIR", "dev/.vllm")
        )
        try:
            for number in range(1, args.rounds + 1):
                loop, fed = run_loop(args, number, work, model, python)
                trl = run_trl(args, number, work, model, python)
                direct = run_direct(args, number)
                outcomes += [loop, trl, *([fed] if fed else []), direct]
                print(msgspec.json.encode([loop, trl, fed, direct]).decode(), file=sys.stderr)
        finally:
            if own:
                dev_vllm("stop", env=env)
    report = Report(
        **heading("python -m bench.learn_loop", sys.argv[1:], now, args.bootstrap),
        rounds=args.rounds,
        target=args.target,
        outcomes=outcomes,
    )
    found_bars = bars(outcomes)
    ResultFiles(args.results, now, "learn").write(
        markdown(report),
        results_json(
            report,
            found_bars,
            wall_s=system_spreads(outcomes, "wall_s"),
            steps=system_spreads(outcomes, "steps"),
        ),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
