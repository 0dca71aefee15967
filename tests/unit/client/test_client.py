"""The episode recorder and producer without a broker: numbering, stamping, context
managers, bounded waits on unreachable brokers, and the produce loop's line handling."""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from stream_export.client import Producer, SyncProducer, produce_lines
from stream_export.client.recorder import EpisodeBuilder, EpisodeRecorder, SyncEpisodeRecorder
from stream_export.contract.calls import CallResponse, ToolCall, ToolFunction
from stream_export.contract.decoding import decode_event, encode
from stream_export.contract.events import EpisodeEnd, EpisodeStart, Step, StepEvent
from stream_export.errors import DecodeError, KafkaUnavailableError, ProduceError, RecorderError
from stream_export.kafka.connection import kafka_options
from stream_export.ops import demo
from stream_export.settings import load
from stream_export.settings.assemble import AssembleSettings
from tests.support.assemble_sim import Pipeline


def ticks() -> Callable[[], float]:
    clock = iter(range(100, 200))
    return lambda: float(next(clock))


def builder(**kwargs: Any) -> EpisodeBuilder:
    return EpisodeBuilder(agent_id="a", prompt="p", clock=ticks(), **kwargs)


def test_the_builder_numbers_steps_and_stamps_times_from_its_clock() -> None:
    b = builder(episode_id="ep", group_id="g", group_size=4, metadata={"domain": "math"})
    start = b.start()
    assert isinstance(start, EpisodeStart) and (start.group_id, start.group_size) == ("g", 4)
    steps = [b.step("thought", "t"), b.step("action", "a", name="x", arguments={"n": 1})]
    end = b.end("success", reward=0.5)
    assert isinstance(start, EpisodeStart) and start.metadata == {"domain": "math"}
    assert [s.seq for s in steps if isinstance(s, Step)] == [0, 1]
    assert [e.time for e in (start, *steps, end)] == [100.0, 101.0, 102.0, 103.0]
    assert {e.episode_id for e in (start, *steps, end)} == {"ep"}
    assert isinstance(end, EpisodeEnd)
    assert (end.steps, end.outcome, end.reward) == (2, "success", 0.5)


def test_episode_ids_are_fresh_uuids_by_default() -> None:
    assert builder().episode_id != builder().episode_id


def test_the_builder_refuses_steps_out_of_order() -> None:
    b = builder()
    with pytest.raises(RecorderError, match="not started"):
        b.step("thought", "early")
    b.start()
    with pytest.raises(RecorderError, match="already started"):
        b.start()
    b.end("other")
    with pytest.raises(RecorderError, match="already ended"):
        b.step("thought", "late")


def test_an_invalid_step_raises_and_takes_no_sequence_number() -> None:
    b = builder()
    b.start()
    with pytest.raises(DecodeError) as info:
        b.step("dance", "x")  # type: ignore[arg-type]
    assert "$.kind" in info.value.detail
    assert b.step("thought", "ok") == Step(
        episode_id=b.episode_id, time=102.0, seq=0, kind="thought", content="ok"
    )


def llm_call(b: EpisodeBuilder, prompt: list[int], completion: list[int], **kw: Any) -> Step:
    request = {
        "messages": [
            {"role": "user", "content": "open it"},
            {"role": "tool", "content": "open", "tool_call_id": "call_1"},
        ],
        "tools": [{"type": "function", "function": {"name": "open_door"}}],
    }
    response = CallResponse(
        content="done",
        reasoning="it is open",
        tool_calls=[ToolCall(id="call_2", function=ToolFunction(name="walk", arguments="{}"))],
    )
    step = b.llm_call(
        request,
        response,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=kw.pop("logprobs", [-1.0] * len(completion)),
        model="tiny",
        weight_version=kw.pop("weight_version", 1),
        finish_reason="stop",
        request_id=f"r{b.steps}",
        **kw,
    )
    assert isinstance(step, Step) and step.call is not None
    return step


def test_llm_calls_go_out_as_deltas_and_the_worker_puts_them_back_together() -> None:
    b = builder(episode_id="ep")
    events: list[StepEvent] = [b.start(), (first := llm_call(b, [1, 2], [3]))]
    events += [b.action("open", name="open_door", id="call_1"), b.result("open", id="call_1")]
    events.append(second := llm_call(b, [1, 2, 3, 4], [5, 6], weight_version="2"))
    events.append(whole := llm_call(b, [1, 2, 3, 4, 5, 6, 7], [8], delta=False))
    events.append(fresh := llm_call(b, [9], [10]))
    with pytest.raises(DecodeError) as info:  # takes no seq, and is no base
        llm_call(b, [9, 10, 11], [12], logprobs=[])
    assert info.value.reason == "token_length_mismatch"
    events += [last := llm_call(b, [9, 10, 11], [12]), b.end("success", reward=1.0)]
    calls = [c.call for c in (first, second, whole, fresh, last) if c.call is not None]
    assert [(c.prompt_base, c.prompt_token_ids) for c in calls] == [
        (None, [1, 2]),
        (0, [4]),
        (None, [1, 2, 3, 4, 5, 6, 7]),
        (None, [9]),
        (5, [11]),
    ]
    assert [e.id for e in events[2:4] if isinstance(e, Step)] == ["call_1", "call_1"]
    assert calls[0].request.messages[1].tool_call_id == "call_1"
    assert calls[0].response.tool_calls == [
        ToolCall(id="call_2", function=ToolFunction(name="walk", arguments="{}"))
    ]
    pipeline = Pipeline(AssembleSettings())
    pipeline.batch(list(enumerate(reversed(events))), 1000.0)
    assert pipeline.dead == []
    (episode,) = pipeline.emitted
    assert episode.tokens is not None
    one, two = episode.tokens.segments
    assert one.input_ids == [1, 2, 3, 4, 5, 6, 7, 8]
    assert one.loss_mask() == [0, 0, 1, 0, 1, 1, 0, 1]
    assert (one.weight_version_min, one.weight_version_max) == (1, "2")
    assert (two.break_reason, two.input_ids, two.loss_mask()) == (
        "prefix_mismatch",
        [9, 10, 11, 12],
        [0, 1, 0, 1],
    )


def sync_recorder() -> tuple[SyncEpisodeRecorder, list[StepEvent]]:
    sent: list[StepEvent] = []
    return SyncEpisodeRecorder(sent.append, agent_id="a", prompt="p", clock=ticks()), sent


def kinds(events: list[StepEvent]) -> list[str]:
    return [e.kind if isinstance(e, Step) else str(e.__struct_config__.tag) for e in events]


def test_the_recorder_methods_produce_the_documented_step_kinds() -> None:
    rec, sent = sync_recorder()
    with rec:
        rec.observation("o")
        rec.thought("t")
        rec.action("a", name="open_door", arguments={"dir": "north"})
        rec.result("r", name="open_door", data={"unlocked": True})
        rec.output("out")
        rec.message("m")
        rec.end("success", reward=1.0)
    assert kinds(sent) == [
        "start",
        "observation",
        "thought",
        "action",
        "action_result",
        "output",
        "message",
        "end",
    ]
    action, result = sent[3], sent[4]
    assert isinstance(action, Step) and action.arguments == {"dir": "north"}
    assert isinstance(result, Step) and result.data == {"unlocked": True}


def test_leaving_with_an_exception_ends_the_episode_as_failed() -> None:
    rec, sent = sync_recorder()
    with pytest.raises(ValueError, match="boom"), rec:
        rec.thought("t")
        raise ValueError("boom")
    end = sent[-1]
    assert isinstance(end, EpisodeEnd)
    assert (end.outcome, end.steps) == ("failure", 1)
    assert end.metadata == {"error": "ValueError: boom"}


def test_leaving_without_end_ends_the_episode_with_outcome_other() -> None:
    rec, sent = sync_recorder()
    with rec:
        rec.thought("t")
    assert kinds(sent) == ["start", "thought", "end"]
    assert isinstance(sent[-1], EpisodeEnd) and sent[-1].outcome == "other"


def test_an_explicit_end_is_not_repeated_on_exit() -> None:
    rec, sent = sync_recorder()
    with rec:
        rec.end("success")
    assert kinds(sent) == ["start", "end"]


def test_no_end_is_attempted_when_kafka_itself_failed() -> None:
    rec, sent = sync_recorder()
    with pytest.raises(KafkaUnavailableError), rec:
        raise KafkaUnavailableError("gone")
    assert kinds(sent) == ["start"]


def test_a_failed_end_never_hides_the_agents_own_exception(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def emit(event: StepEvent) -> None:
        if isinstance(event, EpisodeEnd):
            raise ProduceError("topic gone")

    recorder = SyncEpisodeRecorder(emit, agent_id="a", prompt="p")
    with pytest.raises(ValueError, match="the agent's own"), recorder:
        raise ValueError("the agent's own")
    assert "could not end episode" in caplog.text
    with pytest.raises(ProduceError), SyncEpisodeRecorder(emit, agent_id="a", prompt="p"):
        pass


async def test_the_async_recorder_has_the_same_semantics() -> None:
    sent: list[StepEvent] = []

    async def emit(event: StepEvent) -> None:
        sent.append(event)

    with pytest.raises(RuntimeError):
        async with EpisodeRecorder(emit, agent_id="a", prompt="p") as rec:
            await rec.action("a")
            await rec.result("r")
            raise RuntimeError("agent crashed")
    assert kinds(sent) == ["start", "action", "action_result", "end"]
    assert isinstance(sent[-1], EpisodeEnd) and sent[-1].outcome == "failure"


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A port that accepts TCP connections and never answers."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


async def test_an_unreachable_broker_is_a_clear_error_not_a_hang(black_hole: str) -> None:
    for address in (closed_port(), black_hole):
        began = time.monotonic()
        with pytest.raises(KafkaUnavailableError, match="cannot reach Kafka") as info:
            async with Producer(address, timeout_s=1.5):
                pass
        assert time.monotonic() - began < 10
        assert info.value.retriable


def test_the_sync_producer_also_fails_within_its_timeout(black_hole: str) -> None:
    began = time.monotonic()
    with pytest.raises(KafkaUnavailableError), SyncProducer(black_hole, timeout_s=1.5):
        pass
    assert time.monotonic() - began < 10


async def test_sending_before_start_is_a_usage_error() -> None:
    event = Step(episode_id="e", time=1.0, seq=0, kind="thought")
    with pytest.raises(RecorderError, match="not started"):
        await Producer().send(event)
    with pytest.raises(RecorderError, match="not started"):
        SyncProducer().send(event)


def test_producers_take_broker_topic_limits_and_security_from_settings(tmp_path: Any) -> None:
    password = tmp_path / "pw"
    password.write_text("s3cret\n")
    settings = load(
        env={},
        overrides=[
            "kafka.bootstrap_servers=k1:9093,k2:9093",
            "kafka.security_protocol=SASL_SSL",
            "kafka.sasl_mechanism=SCRAM-SHA-512",
            "kafka.sasl_username=agent",
            f"kafka.sasl_password_file={password}",
            "topics.steps=my-steps",
            "assemble.max_event_bytes=4096",
        ],
    )
    options = kafka_options(settings)
    assert options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("agent", "s3cret")
    assert options["ssl_context"] is not None
    producer = SyncProducer.from_settings(settings, timeout_s=3)
    assert (producer.bootstrap_servers, producer.topic) == ("k1:9093,k2:9093", "my-steps")
    assert (producer.max_event_bytes, producer.timeout_s) == (4096, 3)
    assert kafka_options(load(env={}))["ssl_context"] is None


async def lines(*items: bytes) -> AsyncIterator[bytes]:
    for item in items:
        yield item


GOOD = b'{"type":"step","episode_id":"e","time":1,"seq":0,"kind":"thought"}\n'


@pytest.mark.parametrize(("on_error", "sent", "stopped_at"), [("stop", 1, 3), ("skip", 3, None)])
async def test_bad_lines_are_reported_by_number_and_never_silently_dropped(
    on_error: Any, sent: int, stopped_at: int | None
) -> None:
    reported: list[tuple[int, str]] = []
    report = await produce_lines(
        None,
        lines(GOOD, b"\n", b"{oops\n", GOOD, b'{"type":"nope"}\n', GOOD),
        on_error=on_error,
        on_bad_line=lambda number, error: reported.append((number, error.reason)),
    )
    assert report.sent == sent
    assert report.stopped_at == stopped_at
    expected = [(3, "not_json"), (5, "unknown_type")]
    assert reported == (expected if on_error == "skip" else expected[:1])
    assert [(n, e.reason) for n, e in report.bad] == reported


def test_demo_plays_each_task_as_a_group_of_rollouts() -> None:
    played = list(itertools.islice(demo.scripts(seed=7), 4 * demo.ROLLOUTS))
    groups = [played[i : i + demo.ROLLOUTS] for i in range(0, len(played), demo.ROLLOUTS)]
    for group in groups:
        assert len({s.group_id for s in group}) == 1 and len({s.prompt for s in group}) == 1
        assert {s.group_size for s in group} == {demo.ROLLOUTS}
        assert len({s.episode_id for s in group}) == demo.ROLLOUTS
    assert len({g[0].group_id for g in groups}) == len(groups)  # a fresh id per task
    start = demo.events(played[0], 0.0)[0]
    assert isinstance(start, EpisodeStart) and start.group_size == demo.ROLLOUTS
    one_task = list(itertools.islice(demo.scripts(seed=1, rollouts=50), 50))
    assert {s.success for s in one_task} == {True, False}  # rollouts of a task differ


def test_demo_episodes_are_deterministic_valid_and_complete() -> None:
    first, again = next(demo.episodes(seed=3)), next(demo.episodes(seed=3))
    assert [(e.episode_id, type(e)) for e in first] == [(e.episode_id, type(e)) for e in again]
    for events in itertools.islice(demo.episodes(seed=5), 20):
        start, *steps, end = events
        assert isinstance(start, EpisodeStart) and isinstance(end, EpisodeEnd)
        assert [s.seq for s in steps if isinstance(s, Step)] == list(range(end.steps))
        assert [e.time for e in events] == sorted(e.time for e in events)
        assert all(decode_event(encode(e)) == e for e in events)
