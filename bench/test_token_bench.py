"""The token-plane benchmark's pure parts (no broker): its load, and the raw
pipeline doing the worker's job (the same rows as the project's ``tokens`` format)."""

from __future__ import annotations

import itertools
import struct
import time
from collections import Counter

import msgspec
import pytest

from bench import raw_tokens
from bench.raw_pipeline import DictStore
from bench.report import Spread
from bench.runs import KCAT, RAW, WORKER, Latency, Run
from bench.token_load import COMPLETION, MAX_PROMPT, generate
from bench.token_report import OpenEpisodes, TokenLoadFigures, TokenReport, rates
from bench.token_report import bars as token_bars
from bench.token_report import markdown as token_markdown
from bench.token_report import summary as token_summary
from bench.token_report import to_json as token_json
from bench.tokens import episode_of
from stream_export.assemble.episode import build_episode
from stream_export.assemble.state import PartitionState, receive
from stream_export.assemble.verdicts import Verdict
from stream_export.contract.decoding import decode_event
from stream_export.contract.events import Step
from stream_export.output import formatter
from stream_export.runtime.metrics import Metrics
from stream_export.settings.assemble import AssembleSettings
from stream_export.settings.format import FormatSettings

NOW = time.time()


def _project_rows(messages: list[tuple[bytes, bytes]]) -> list[bytes]:
    """The rows the worker's own pure code makes of ``messages`` (assembler, format)."""
    store = DictStore()
    state = PartitionState(0, AssembleSettings(), store)
    fmt = formatter.build(FormatSettings(format="tokens"), Metrics())
    lines: list[bytes] = []
    for start in range(0, len(messages), 40):
        for offset, (key, value) in enumerate(messages[start : start + 40], start):
            assert receive(state, key, value, offset, time.time()).result is Verdict.ACCEPTED
        finished = state.take_finished()
        for item in finished:
            episode = build_episode(0, item)
            assert episode is not None
            lines += fmt(episode)
        store.persist(state, finished, 3600.0)
    return lines


def test_the_load_is_seeded_and_within_its_bounds() -> None:
    load = generate(40, seed=5, now=NOW, window=8)
    assert load.messages == generate(40, seed=5, now=NOW, window=8).messages
    assert load.messages != generate(40, seed=6, now=NOW, window=8).messages
    assert load.episodes == 40
    assert len(load.messages) == sum(n + 2 for n in load.ended.values())
    assert all(2 <= n <= 8 for n in load.ended.values())
    assert load.calls == sum(load.ended.values())
    assert 0.5 * load.calls < load.deltas < load.calls - load.episodes  # some compactions
    order: dict[str, list[str]] = {}
    full: dict[tuple[str, int], list[int]] = {}
    for key, value in load.messages:
        event = decode_event(value)
        assert event.episode_id.encode() == key
        order.setdefault(event.episode_id, []).append(type(event).__name__)
        if isinstance(event, Step):
            call = event.call
            assert call is not None
            prompt = call.prompt_token_ids
            if call.prompt_base is not None:
                base = full[event.episode_id, call.prompt_base]
                prompt = base + prompt
                assert 20 <= len(call.prompt_token_ids) <= 200
            assert 1000 <= len(prompt) <= MAX_PROMPT
            assert COMPLETION[0] <= len(call.completion_token_ids) <= COMPLETION[1]
            assert len(call.logprobs) == len(call.completion_token_ids)
            for lp in call.logprobs:  # float32 values, as vLLM computes them
                assert lp <= 0 and struct.unpack("<f", struct.pack("<f", lp))[0] == lp
            full[event.episode_id, event.seq] = prompt + call.completion_token_ids
    first = order[next(iter(order))]
    assert first[0] == "EpisodeStart" and first[-1] == "EpisodeEnd"
    assert all(o[1:-1] == ["Step"] * (len(o) - 2) for o in order.values())
    ids = [key for key, _ in load.messages]
    interleaved = sum(a != b for a, b in itertools.pairwise(ids))
    assert interleaved > 2 * load.episodes


def test_the_raw_pipeline_writes_the_rows_the_worker_writes() -> None:
    """Proof that the baseline does the same job: its rows equal the project's."""
    load = generate(30, seed=9, now=NOW, window=6)
    episodes: dict[str, raw_tokens.Open] = {}
    raw: list[bytes] = []
    for _, value in load.messages:
        raw += raw_tokens.take(episodes, value)
    assert not episodes
    ours = _project_rows(load.messages)

    def keyed(lines: list[bytes]) -> dict[tuple[str, int], bytes]:
        out = {}
        for line in lines:
            row = msgspec.json.decode(line)
            out[row["episode_id"], row["segment"]] = line
        return out

    mine, theirs = keyed(raw), keyed(ours)
    assert len(mine) == len(raw) == load.rows
    assert mine == theirs  # byte for byte
    assert sum(len(msgspec.json.decode(v)["input_ids"]) for v in mine.values()) == load.tokens
    assert Counter(seg for _, seg in mine).most_common(1)[0] == (0, 30)
    assert any(seg > 0 for _, seg in mine)  # compactions broke some episodes


def test_the_raw_pipeline_waits_for_every_step_and_keeps_a_seq_once() -> None:
    load = generate(1, seed=3, now=NOW)
    start, *steps, end = (v for _, v in load.messages)
    episodes: dict[str, raw_tokens.Open] = {}
    assert raw_tokens.take(episodes, start) == []
    assert raw_tokens.take(episodes, steps[0]) == []
    assert raw_tokens.take(episodes, end) == []  # steps missing: not yet
    lines: list[bytes] = []
    for value in [steps[0], *steps[1:]]:  # the first one again: kept once
        lines += raw_tokens.take(episodes, value)
    assert lines == _project_rows(load.messages)
    assert not episodes


@pytest.mark.parametrize("version", [3, "7"])
def test_raw_rows_take_weight_versions_by_value(version: int | str) -> None:
    call = raw_tokens.Call([1, 2], [3], [-0.5], version)
    later = raw_tokens.Call([4], [5], [-0.25], 12, prompt_base=0)
    end = raw_tokens.Event(type="end", episode_id="e", steps=2, outcome="success")
    (row,) = raw_tokens.rows("e", [(0, call), (1, later)], end)
    assert row["input_ids"] == [1, 2, 3, 4, 5]
    assert row["loss_mask"] == [0, 0, 1, 0, 1]
    assert row["logprobs"] == [0.0, 0.0, -0.5, 0.0, -0.25]
    assert (row["weight_version_min"], row["weight_version_max"]) == (version, 12)


def _figures() -> TokenLoadFigures:
    return TokenLoadFigures(
        episodes=100,
        messages=700,
        calls=500,
        deltas=350,
        rows=150,
        tokens=2_000_000,
        bytes=70_000_000,
        partitions=4,
    )


def _token_report(latency: Latency | None, opened: OpenEpisodes | None) -> TokenReport:
    def run(system: str, round_: int, rate: float) -> Run:
        return Run(
            system=system,
            round=round_,
            events_per_s=rate,
            cpu_us_per_event=1000.0,
            peak_rss_mb=200.0,
            wall_s=9.0,
        )

    return TokenReport(
        date="2026-12-04 09:00 UTC",
        command="python -m bench.tokens --rounds 2",
        machine="2 cores",
        broker="given",
        load=_figures(),
        rounds=2,
        poll_ms=20,
        runs=[
            run(KCAT, 1, 7000),
            run(RAW, 1, 1000),
            run(WORKER, 1, 400),
            run(KCAT, 2, 7000),
            run(RAW, 2, 1000),
            run(WORKER, 2, 200),
        ],
        latency=latency,
        open_episodes=opened,
    )


OPENED = OpenEpisodes(
    episodes=10_000,
    calls=3,
    mb=500,
    take_in_s=60,
    peak_rss_mb=700,
    restart_peak_rss_mb=1100,
    consume_again_s=5,
    rebuild_s=1,
)


def test_token_rates_are_the_message_rate_times_the_load_per_message() -> None:
    report = _token_report(None, None)
    assert rates(report.load, report.runs[1]) == pytest.approx((2_000_000 / 0.7, 100.0))
    s = token_summary(report)
    assert list(s) == [KCAT, RAW, WORKER]
    assert s[WORKER]["mb_per_s"] == Spread(20.0, 30.0, 40.0)
    assert s[RAW]["cpu_ms_per_mb"].median == pytest.approx(10.0)  # 1 ms/message, 10/MB


def test_token_bars_and_markdown_give_each_figure_and_verdict() -> None:
    lat = Latency(
        rate_events_per_s=150, episodes=600, seconds=30, p50_s=0.2, p90_s=0.5, p99_s=0.9, max_s=2
    )
    report = _token_report(lat, OPENED)
    verdicts = [(b.name, b.verdict, b.stretch) for b in token_bars(report)]
    assert verdicts == [
        ("worker / raw pipeline, MB/s", "met", 0.5),  # median 0.3
        ("end-to-end p99 at half load, s", "met", None),
        ("peak RSS, 10,000 open token episodes, MB", "missed", None),  # the restart's 1,100
    ]
    lines = token_markdown(report).splitlines()
    assert "| worker | 571,429 / 857,143 / 1,142,857 | 20.0 / 30.0 / 40.0 | 10.0 | 200 |" in lines
    assert "| 1 | 0.400 | 0.0571 |" in lines
    assert "| 2 | 0.200 | 0.0286 |" in lines
    assert (
        "| worker / raw pipeline, MB/s | >= 0.300 (0.500) | 0.200 / 0.300 / 0.400 "
        "| met (stretch not) |" in lines
    )
    assert "| end-to-end p99 at half load, s | <= 1.00 | 0.900 / 0.900 / 0.900 | met |" in lines
    text = "\n".join(lines)
    assert "at 150 messages/s (0.50 of the worker's median rate), 30 s from" in text
    assert "p50 0.20 s, p90 0.50 s, p99 0.90 s" in text
    assert "10,000 episodes of a start and 3 calls each (500 MB)" in text
    derived = msgspec.json.decode(token_json(_token_report(None, None)))
    assert [b["verdict"] for b in derived["bars"]] == ["met", "not measured", "not measured"]
    assert derived["ratios"]["worker / raw pipeline"]["median"] == pytest.approx(0.3)


def test_the_latency_run_finds_a_rows_episode_without_decoding_it() -> None:
    load = generate(3, seed=4, now=NOW)
    lines = _project_rows(load.messages)
    assert [episode_of(line) for line in lines] == [
        msgspec.json.decode(line)["episode_id"] for line in lines
    ]
