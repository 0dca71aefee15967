"""The gateway overhead benchmark's results (``python -m bench.gateway``): latency
percentiles and req/s per target, the time each proxy adds over calling the
upstream directly, issue 27's bars, Markdown and JSON (pure, no I/O).

A cell is one target measured at one concurrency and one mode (streaming or not)
in one round. What a proxy adds is its cell's p50 (p99) minus the direct cell's
p50 (p99) of the same round, concurrency and mode: the direct cell ran just
before it, so a busy moment of the shared machine weighs on both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import msgspec

from bench.gateway_load import Measured
from bench.report import (
    Bar,
    RoundsHeading,
    Spread,
    bar_table,
    cells,
    num,
    page,
    percentile,
    results_json,
    row,
    spread,
    title,
)

DIRECT: Final = "direct"
GATEWAY: Final = "gateway"
LITELLM: Final = "litellm"
#: With ``--vllm``: the same two at the highest concurrency, in front of a real vLLM.
VLLM_DIRECT: Final = "direct (vLLM)"
VLLM_ASKED: Final = "direct (vLLM), ids + logprobs"
VLLM_GATEWAY: Final = "gateway (vLLM)"
#: In the order of a cell's runs, and of the tables.
TARGETS: Final = (DIRECT, GATEWAY, LITELLM, VLLM_DIRECT, VLLM_ASKED, VLLM_GATEWAY)
#: What each proxy's cells are compared with (the same round, clients and mode).
BASE: Final = {GATEWAY: DIRECT, LITELLM: DIRECT, VLLM_GATEWAY: VLLM_ASKED}
#: Each direct target the gateway's req/s is set against, and that gateway.
THROUGHPUT_PAIRS: Final = {DIRECT: GATEWAY, VLLM_DIRECT: VLLM_GATEWAY, VLLM_ASKED: VLLM_GATEWAY}
MODES: Final = (False, True)
#: Bars: the gateway's added p50 at most this share of LiteLLM's; its req/s at
#: least this share of direct's at the highest concurrency.
ADDED_SHARE: Final = 0.5
THROUGHPUT_SHARE: Final = 0.9


class Cell(msgspec.Struct, kw_only=True):
    """One target at one concurrency and mode in one round."""

    target: str
    clients: int
    stream: bool
    round: int
    calls: int
    errors: int
    p50_ms: float
    p99_ms: float
    req_per_s: float
    #: CPU of the target's own process(es) per call (direct: the upstream's).
    cpu_ms_per_call: float
    #: CPU of the clients' process per call.
    client_cpu_ms_per_call: float
    #: Share of the machine's CPU time busy (every process's) over the window.
    machine_busy: float


class GatewayReport(RoundsHeading, kw_only=True):
    seconds: float
    #: A cell's measured seconds in front of vLLM (None: run without ``--vllm``).
    served_seconds: float | None = None
    warmup_s: float
    concurrency: list[int]
    litellm: str
    cells: list[Cell] = msgspec.field(default_factory=list)
    notes: list[str] = msgspec.field(default_factory=list)


class Reading(msgspec.Struct):
    """CPU seconds of the target and of the clients, and the machine's (busy, all)
    jiffies (/proc/stat), at one moment."""

    target_s: float
    client_s: float
    machine: tuple[int, int]


class Usage(msgspec.Struct):
    """CPU used over a window: the target's and the clients' seconds, and the share
    of the machine's time that was busy."""

    target_s: float
    client_s: float
    busy: float


def machine_jiffies(proc_stat: str) -> tuple[int, int]:
    """(busy, all) jiffies of all CPUs from /proc/stat's first line (idle and iowait
    are not busy)."""
    fields = [int(f) for f in proc_stat.split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def usage(first: Reading, last: Reading) -> Usage:
    busy, total = (b - a for a, b in zip(first.machine, last.machine, strict=True))
    return Usage(
        target_s=last.target_s - first.target_s,
        client_s=last.client_s - first.client_s,
        busy=busy / total if total else float("nan"),
    )


def cell(
    target: str, clients: int, stream: bool, round_: int, got: Measured, seconds: float, used: Usage
) -> Cell:
    """A cell from what the clients measured over a window ``seconds`` long and the
    CPU used over it."""
    ms = [x * 1000 for x in got.latencies] or [float("nan")]
    per_call = 1000 / got.completed if got.completed else float("nan")
    return Cell(
        target=target,
        clients=clients,
        stream=stream,
        round=round_,
        calls=len(got.latencies),
        errors=got.errors,
        p50_ms=percentile(ms, 50),
        p99_ms=percentile(ms, 99),
        req_per_s=got.completed / seconds,
        cpu_ms_per_call=used.target_s * per_call,
        client_cpu_ms_per_call=used.client_s * per_call,
        machine_busy=used.busy,
    )


def mode_name(stream: bool) -> str:
    return "streaming" if stream else "non-streaming"


def _pairs(
    cells: Sequence[Cell], target: str, clients: int, stream: bool, other: str
) -> list[tuple[Cell, Cell]]:
    """``target``'s cells at this concurrency and mode, each with ``other``'s cell of
    the same round (rounds where both ran)."""
    by = {(c.target, c.clients, c.stream, c.round): c for c in cells}
    return [
        (c, by[other, clients, stream, c.round])
        for c in cells
        if (c.target, c.clients, c.stream) == (target, clients, stream)
        and (other, clients, stream, c.round) in by
    ]


def added(
    cells: Sequence[Cell], target: str, clients: int, stream: bool
) -> list[tuple[float, float]]:
    """(added p50, added p99) in ms of ``target`` over its direct cell, per round
    where both ran."""
    return [
        (c.p50_ms - base.p50_ms, c.p99_ms - base.p99_ms)
        for c, base in _pairs(cells, target, clients, stream, BASE[target])
    ]


def _shares(cells: Sequence[Cell], clients: int, stream: bool, over: str) -> list[float]:
    """Per round, the gateway over ``over``: its added p50 over LiteLLM's (rounds
    where LiteLLM added time), or its req/s over direct's (either upstream's)."""
    if over in THROUGHPUT_PAIRS:
        mine = THROUGHPUT_PAIRS[over]
        return [c.req_per_s / d.req_per_s for c, d in _pairs(cells, mine, clients, stream, over)]
    gateway, other = (
        {c.round: c.p50_ms - d.p50_ms for c, d in _pairs(cells, t, clients, stream, DIRECT)}
        for t in (GATEWAY, over)
    )
    return [gateway[r] / other[r] for r in gateway if other.get(r, 0) > 0]


def bars(report: GatewayReport) -> list[Bar]:
    """Issue 27's bars: per concurrency and mode, the gateway's added p50 over
    LiteLLM's (per round); at the highest concurrency, its req/s over direct's, and
    the same in front of vLLM when it was measured."""
    top = max(report.concurrency)
    wanted = [
        (f"gateway / LiteLLM added p50, {clients} clients", "<=", ADDED_SHARE, clients, LITELLM)
        for clients in report.concurrency
    ] + [(f"gateway / direct req/s, {top} clients", ">=", THROUGHPUT_SHARE, top, DIRECT)]
    if report.served_seconds is not None:
        for over, what in ((VLLM_ASKED, "asking ids + logprobs too"), (VLLM_DIRECT, "plain")):
            name = f"gateway / direct req/s, {top} clients, vLLM upstream, direct {what}"
            wanted.append((name, ">=", THROUGHPUT_SHARE, top, over))
    out = []
    for name, op, target, clients, over in wanted:
        for stream in MODES:
            shares = _shares(report.cells, clients, stream, over)
            out.append(
                Bar(
                    name=f"{name}, {mode_name(stream)}",
                    op=op,
                    target=target,
                    value=spread(shares) if shares else None,
                )
            )
    return out


class Row(msgspec.Struct, kw_only=True):
    """One target at one concurrency and mode over the rounds (min/median/max)."""

    stream: bool
    clients: int
    target: str
    rounds: int
    errors: int
    p50_ms: Spread
    p99_ms: Spread
    req_per_s: Spread
    cpu_ms_per_call: Spread
    client_cpu_ms_per_call: Spread
    machine_busy: Spread
    #: Proxies only: over direct in the same round.
    added_p50_ms: Spread | None
    added_p99_ms: Spread | None


def summary(report: GatewayReport) -> list[Row]:
    """Per mode, concurrency and target, in table order."""
    rows: list[Row] = []
    for stream in MODES:
        for clients in report.concurrency:
            for target in TARGETS:
                mine = [
                    c
                    for c in report.cells
                    if (c.target, c.clients, c.stream) == (target, clients, stream)
                ]
                if not mine:
                    continue
                more = added(report.cells, target, clients, stream) if target in BASE else []
                rows.append(
                    Row(
                        stream=stream,
                        clients=clients,
                        target=target,
                        rounds=len(mine),
                        errors=sum(c.errors for c in mine),
                        p50_ms=spread([c.p50_ms for c in mine]),
                        p99_ms=spread([c.p99_ms for c in mine]),
                        req_per_s=spread([c.req_per_s for c in mine]),
                        cpu_ms_per_call=spread([c.cpu_ms_per_call for c in mine]),
                        client_cpu_ms_per_call=spread([c.client_cpu_ms_per_call for c in mine]),
                        machine_busy=spread([c.machine_busy for c in mine]),
                        added_p50_ms=spread([a for a, _ in more]) if more else None,
                        added_p99_ms=spread([b for _, b in more]) if more else None,
                    )
                )
    return rows


def to_json(report: GatewayReport) -> bytes:
    return results_json(report, bars(report), summary=summary(report))


WHAT: Final = {
    DIRECT: "the clients call the fixed-answer upstream itself",
    GATEWAY: "`stream-export gateway` in front of it: one episode per client (bound by "
    "the path prefix), token ids and logprobs asked upstream and stripped, the call's "
    "llm_call event fsync'd to the state directory and acknowledged by Kafka (acks=all) "
    "before the answer",
    LITELLM: "LiteLLM's proxy in front of it (its `litellm` command, one worker, the "
    "upstream as an `openai/` model, a master key, no database)",
    VLLM_DIRECT: "the clients call a real vLLM (`--vllm`, dev/vllm's tiny model on CPU: "
    "16 sampled tokens a call, which costs real CPU on the same two cores; its own CPU "
    "is not read, nan)",
    VLLM_ASKED: "the same, each call asking for what the gateway asks vLLM for besides "
    "(`logprobs`, `return_token_ids`), which costs vLLM more than a plain call",
    VLLM_GATEWAY: "a second gateway, set up as the first, in front of that vLLM (its added "
    "time is over the direct calls that ask what it asks)",
}


def markdown(report: GatewayReport) -> str:
    lines = [
        *title("Gateway overhead benchmark", report, f"LiteLLM {report.litellm}"),
        "",
        "The upstream is a **fixed-answer upstream** (bench/fixed_upstream.py), not an "
        "inference server: it answers every chat completion at once with the same "
        "16-token completion in vLLM's shape (prompt_token_ids, choices[].token_ids, "
        "logprobs when asked), so what is measured is what each proxy adds. Closed-loop "
        f"clients (one aiohttp session, each client one call at a time) at "
        f"{', '.join(str(c) for c in report.concurrency)} concurrent clients, non-streaming "
        f"and streaming; each cell {report.warmup_s:g} s of warm-up then {report.seconds:g} s "
        f"measured; {report.rounds} round(s), each running every cell as direct, gateway, "
        "LiteLLM in turn. Latency is from sending a request to having read its whole "
        "answer (a stream: through `[DONE]`). Added = the proxy's figure minus direct's "
        "in the same round. Figures are min / median / max over rounds.",
        *(
            [
                "",
                "With `--vllm`, each round then runs direct (plain, and asking for token ids "
                "and logprobs as the gateway does) and gateway again at the highest "
                "concurrency in front of a **real vLLM**: the throughput bar with an upstream "
                "that does the work a call costs (each proxy's own cost is what the fixed "
                "answer isolates; whether the gateway holds back a real server is this). "
                f"Those cells measure {report.served_seconds:g} s each (a call takes "
                "about a second).",
            ]
            if report.served_seconds is not None
            else []
        ),
        "",
        row(
            "mode",
            "clients",
            "target",
            "p50 ms",
            "p99 ms",
            "req/s",
            "added p50 ms",
            "added p99 ms",
            "CPU ms/call",
            "client CPU ms/call (median)",
            "machine busy (median)",
            "errors",
        ),
        row("---", "---:", "---", *["---"] * 6, "---:", "---:", "---:"),
    ]
    for r in summary(report):
        lines.append(
            row(
                mode_name(r.stream),
                r.clients,
                r.target,
                cells(r.p50_ms),
                cells(r.p99_ms),
                cells(r.req_per_s),
                cells(r.added_p50_ms),
                cells(r.added_p99_ms),
                cells(r.cpu_ms_per_call),
                num(r.client_cpu_ms_per_call.median),
                f"{r.machine_busy.median:.0%}",
                r.errors,
            )
        )
    lines += ["", *bar_table(27, bars(report))]
    measured = {c.target for c in report.cells}
    lines += [
        "",
        "Targets: " + "; ".join(f"{t}: {WHAT[t]}" for t in TARGETS if t in measured) + ".",
    ]
    lines += [
        "",
        "A bar's figure is per round (the gateway's added p50 over LiteLLM's; its req/s "
        "over direct's); its verdict is the median's. CPU ms/call: utime+stime of the "
        "target's processes (/proc) over the measured window per call completed in it "
        "(direct: the upstream's; the gateway's excludes the broker's); client CPU: the "
        "benchmark's own process, which runs the clients; machine busy: the share of both "
        "cores' time not idle over the window (/proc/stat), every process on the machine "
        "counted, the broker's and other users' too.",
    ]
    return page(lines, report.notes)
