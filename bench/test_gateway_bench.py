"""Self-tests of python -m bench.gateway's pure parts and of its fixed-answer
upstream, which the gateway must read as it reads vLLM (no broker, no LiteLLM)."""

from __future__ import annotations

import asyncio
import json
import math

import msgspec
import pytest
from aiohttp.test_utils import TestServer

from bench import fixed_upstream
from bench.fixed_upstream import COMPLETION, PROMPT_TOKEN_IDS, Upstream, answer, chunks, sse
from bench.gateway_load import Measured, answered, drive, request_body
from bench.gateway_report import (
    DIRECT,
    GATEWAY,
    LITELLM,
    VLLM_ASKED,
    VLLM_DIRECT,
    VLLM_GATEWAY,
    Cell,
    GatewayReport,
    Reading,
    Usage,
    added,
    bars,
    cell,
    machine_jiffies,
    markdown,
    summary,
    to_json,
    usage,
)
from bench.report import Spread
from stream_export.gateway.mapping import StreamGather, sampled, strip, upstream_request
from stream_export.gateway.upstream import Upstreams
from stream_export.gateway_settings import GatewaySettings

IDS = [i for _, i, _ in COMPLETION]
LOGPROBS = [lp for _, _, lp in COMPLETION]
TEXT = "".join(t for t, _, _ in COMPLETION)
REQUEST = json.loads(request_body(stream=False))


def test_the_fixed_answer_gives_the_gateway_what_vllm_gives_it() -> None:
    sent, asked = upstream_request("chat", REQUEST)
    whole = answer(sent, 7)
    call = sampled("chat", whole)
    assert call.prompt_token_ids == list(PROMPT_TOKEN_IDS)
    assert call.completion_token_ids == IDS and len(IDS) == 16
    assert call.logprobs == LOGPROBS and all(lp < 0 for lp in LOGPROBS)
    assert call.response.content == TEXT
    assert (call.finish_reason, call.request_id) == ("length", "chatcmpl-0000000000000007")
    plain = strip(whole, asked)  # what the agent gets: vLLM's answer when not asked
    unasked = answer(REQUEST, 7)  # vLLM's answer to the agent's own request, less two nulls
    del unasked["prompt_token_ids"], unasked["choices"][0]["token_ids"]
    assert plain == unasked


def test_unasked_the_fixed_answer_carries_no_ids_or_logprobs_as_vllm() -> None:
    whole = answer(REQUEST, 1)
    assert whole["prompt_token_ids"] is None
    assert whole["choices"][0]["token_ids"] is None and whole["choices"][0]["logprobs"] is None
    assert whole["usage"]["completion_tokens"] == 16
    parts = chunks({**REQUEST, "stream": True}, 1)
    assert parts[0]["prompt_token_ids"] is None
    assert all(c["choices"][0]["logprobs"] is None for c in parts[1:])


def _events(stream: bytes) -> list[bytes]:
    return [line[6:] for line in stream.split(b"\n\n") if line.startswith(b"data: ")]


def test_the_stream_gathers_to_the_same_call_as_the_whole_answer() -> None:
    usage = {"stream_options": {"include_usage": True}}
    sent, _ = upstream_request("chat", {**REQUEST, "stream": True, **usage})
    events = _events(sse(chunks(sent, 3)))
    assert events[-1] == b"[DONE]"
    gather = StreamGather("chat")
    for event in events[:-1]:
        gather.feed(json.loads(event))
    streamed, whole = gather.result(), sampled("chat", answer(sent, 3))
    assert streamed == whole
    assert len(events) == 1 + 16 + 1 + 1  # the role, a token a chunk, the usage, [DONE]
    assert streamed.usage is not None
    assert streamed.usage["total_tokens"] == len(PROMPT_TOKEN_IDS) + 16
    assert len(chunks({**sent, "stream_options": None}, 3)) == 1 + 16


def test_the_gateway_reads_the_served_upstream_over_http() -> None:
    """The gateway's own upstream client against the running app, both modes."""

    async def go() -> None:
        async with TestServer(Upstream().app()) as server:
            settings = GatewaySettings(upstreams=[str(server.make_url("/v1"))])
            upstreams = Upstreams(settings, on_retry=lambda: None)
            await upstreams.start()
            try:
                sent, _ = upstream_request("chat", REQUEST)
                whole = await upstreams.post("/chat/completions", sent, "e", "req-1")
                assert isinstance(whole, dict)
                assert sampled("chat", whole).completion_token_ids == IDS
                gather = StreamGather("chat")
                got = upstreams.stream("/chat/completions", {**sent, "stream": True}, "e", "req-2")
                async for chunk in got:
                    if chunk is None:
                        break
                    assert isinstance(chunk, dict)
                    gather.feed(chunk)
                assert gather.result().logprobs == LOGPROBS
                status, body, _ = await upstreams.get("/models")
                assert status == 200 and json.loads(body)["data"][0]["id"] == fixed_upstream.MODEL
                url = str(server.make_url("/v1/chat/completions"))
                measured = await drive([url] * 2, {}, True, 0.05, 0.2)
                assert measured.errors == 0 and measured.completed > 0
                assert measured.latencies and all(0 < x < 5 for x in measured.latencies)
            finally:
                await upstreams.close()

    asyncio.run(go())


def test_an_answer_counts_only_when_whole() -> None:
    done = sse(chunks({**REQUEST, "stream": True}, 1))
    assert answered(200, done, stream=True)
    assert not answered(200, done[: -len(b"data: [DONE]\n\n")], stream=True)
    assert not answered(200, b'data: {"error": {"code": "kafka_unavailable"}}\n\n', stream=True)
    assert not answered(503, b'{"choices": []}', stream=False)
    assert answered(200, msgspec.json.encode(answer(REQUEST, 1)), stream=False)


def _cell(target: str, clients: int, stream: bool, r: int, p50: float, rate: float) -> Cell:
    return Cell(
        target=target,
        clients=clients,
        stream=stream,
        round=r,
        calls=100,
        errors=0,
        p50_ms=p50,
        p99_ms=2 * p50,
        req_per_s=rate,
        cpu_ms_per_call=0.5,
        client_cpu_ms_per_call=0.25,
        machine_busy=0.75,
    )


def test_a_cell_takes_percentiles_rate_and_cpu_per_call() -> None:
    got = Measured(latencies=[i / 1000 for i in range(1, 101)], completed=250, errors=1)
    used = Usage(target_s=0.25, client_s=0.5, busy=0.8)
    made = cell(GATEWAY, 16, True, 2, got, seconds=5.0, used=used)
    assert made.p50_ms == pytest.approx(50.5) and made.p99_ms == pytest.approx(99.01)
    assert (made.req_per_s, made.cpu_ms_per_call, made.calls, made.errors) == (50.0, 1.0, 100, 1)
    assert (made.client_cpu_ms_per_call, made.machine_busy) == (2.0, 0.8)
    empty = cell(LITELLM, 64, False, 1, Measured(), seconds=5.0, used=used)
    assert math.isnan(empty.p50_ms) and math.isnan(empty.cpu_ms_per_call) and empty.req_per_s == 0


def test_cpu_usage_over_a_window_from_two_readings() -> None:
    before = "cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\n"
    after = "cpu  400 0 150 900 50 0 0 0 0 0\ncpu0 1 1 1 1 1 1 1 1 1 1\n"
    assert machine_jiffies(before) == (150, 1000)
    first = Reading(target_s=1.0, client_s=2.0, machine=machine_jiffies(before))
    last = Reading(target_s=1.5, client_s=2.25, machine=machine_jiffies(after))
    assert usage(first, last) == Usage(target_s=0.5, client_s=0.25, busy=0.8)  # 400 of 500


def _report() -> GatewayReport:
    cells = []
    for r, noise in ((1, 1.0), (2, 2.0)):
        for clients in (1, 64):
            for stream in (False, True):
                base = noise * clients
                cells += [
                    _cell(DIRECT, clients, stream, r, base, 1000 / noise),
                    _cell(GATEWAY, clients, stream, r, base + 2 * noise, 950 / noise),
                    _cell(LITELLM, clients, stream, r, base + (5 if r == 1 else 10), 100),
                ]
    cells = [c for c in cells if not (c.target == LITELLM and c.clients == 64 and c.stream)]
    return GatewayReport(
        date="2026-12-06 08:00 UTC",
        command="python -m bench.gateway --rounds 2",
        machine="2 cores",
        broker="given",
        rounds=2,
        poll_ms=20,
        seconds=5,
        warmup_s=1,
        concurrency=[1, 64],
        litellm="1.108.7",
        cells=cells,
    )


def test_added_time_is_over_direct_in_the_same_round() -> None:
    report = _report()
    assert added(report.cells, GATEWAY, 64, False) == [(2.0, 4.0), (4.0, 8.0)]
    assert added(report.cells, LITELLM, 1, True) == [(5.0, 10.0), (10.0, 20.0)]
    rows = {(r.target, r.clients, r.stream): r for r in summary(report)}
    assert rows[GATEWAY, 64, False].added_p50_ms == Spread(2.0, 3.0, 4.0)
    assert rows[DIRECT, 1, False].added_p50_ms is None
    assert rows[DIRECT, 64, True].req_per_s == Spread(500.0, 750.0, 1000.0)
    assert (LITELLM, 64, True) not in rows


def test_bars_take_per_round_ratios_and_say_what_was_not_measured() -> None:
    verdicts = {b.name: (b.value, b.verdict) for b in bars(_report())}
    share = "gateway / LiteLLM added p50, {} clients, {}"
    assert verdicts[share.format(1, "non-streaming")] == (Spread(0.4, 0.4, 0.4), "met")
    assert verdicts[share.format(64, "streaming")] == (None, "not measured")
    rate = verdicts["gateway / direct req/s, 64 clients, streaming"]
    assert rate == (Spread(0.95, 0.95, 0.95), "met")
    assert len(verdicts) == 6


def test_markdown_and_json_give_every_figure() -> None:
    report = _report()
    report.notes.append("the gateway's state directory is on ext4")
    lines = markdown(report).splitlines()
    assert "**fixed-answer upstream**" in lines[4]
    row = (
        "| non-streaming | 64 | gateway | 66.0 / 99.0 / 132 | 132 / 198 / 264 | 475 / 712 / 950 "
        "| 2.00 / 3.00 / 4.00 | 4.00 / 6.00 / 8.00 | 0.500 / 0.500 / 0.500 | 0.250 | 75% | 0 |"
    )
    assert row in lines
    assert (
        "| gateway / LiteLLM added p50, 64 clients, non-streaming | <= 0.500 "
        "| 0.400 / 0.400 / 0.400 | met |"
    ) in lines
    assert "Note: the gateway's state directory is on ext4" in lines
    data = msgspec.json.decode(to_json(report))
    assert [b["verdict"] for b in data["bars"]].count("not measured") == 1
    assert len(data["cells"]) == 22 and data["summary"][0]["target"] == DIRECT


def test_a_proxy_slower_than_direct_by_nothing_gives_no_ratio() -> None:
    report = _report()
    report.cells = [
        _cell(DIRECT, 1, False, 1, 5.0, 10),
        _cell(GATEWAY, 1, False, 1, 6.0, 10),
        _cell(LITELLM, 1, False, 1, 5.0, 10),  # added nothing: no share to take
    ]
    report.concurrency = [1]
    (first, *_) = bars(report)
    assert first.value is None and first.verdict == "not measured"


def test_in_front_of_vllm_the_gateway_is_compared_with_vllm_direct() -> None:
    report = _report()
    assert not any("vLLM" in b.name for b in bars(report))
    report.served_seconds = 20.0
    for r, rate in ((1, 100.0), (2, 80.0)):
        report.cells += [
            _cell(VLLM_DIRECT, 64, False, r, 250.0, rate * 5 / 4),
            _cell(VLLM_ASKED, 64, False, r, 300.0, rate),
            _cell(VLLM_GATEWAY, 64, False, r, 310.0, rate * 3 / 4),
        ]
    assert added(report.cells, VLLM_GATEWAY, 64, False) == [(10.0, 20.0), (10.0, 20.0)]
    verdicts = {b.name: (b.value, b.verdict) for b in bars(report)}
    served = "gateway / direct req/s, 64 clients, vLLM upstream, direct {}, {}"
    asked = served.format("asking ids + logprobs too", "non-streaming")
    assert verdicts[asked] == (Spread(0.75, 0.75, 0.75), "missed")
    assert verdicts[served.format("plain", "non-streaming")] == (Spread(0.6, 0.6, 0.6), "missed")
    assert verdicts[served.format("plain", "streaming")] == (None, "not measured")
    text = markdown(report)
    assert "**real vLLM**" in text and "direct (vLLM): the clients call a real vLLM" in text
    assert "Those cells measure 20 s each" in text
    assert "| non-streaming | 64 | gateway (vLLM) | 310 / 310 / 310 |" in text


def test_the_asking_direct_client_asks_what_the_gateway_asks_upstream() -> None:
    plain, asked = (json.loads(request_body(True, tokens=t)) for t in (False, True))
    sent, _ = upstream_request("chat", plain, tokens=True)
    assert {k: sent[k] for k in ("logprobs", "return_token_ids")} == {
        "logprobs": True,
        "return_token_ids": True,
    }
    assert asked == {**plain, "logprobs": True, "return_token_ids": True}
