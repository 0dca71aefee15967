"""The export's summary names each reason an episode was left out, with its count."""

from __future__ import annotations

import msgspec

from stream_export.contract.episode import Episode
from stream_export.contract.events import Step
from stream_export.ops.export import left_out
from stream_export.output import formatter
from stream_export.runtime.metrics import Metrics
from stream_export.settings.format import FormatSettings


def episode(outcome: str, *kinds: str) -> Episode:
    steps = [
        Step(episode_id="e", time=1.0, seq=i, kind=kind, content="x")  # type: ignore[arg-type]
        for i, kind in enumerate(kinds)
    ]
    return Episode(
        episode_id="e",
        agent_id="a",
        prompt="task",
        steps=steps,
        start_time=0.0,
        end_time=1.0,
        outcome=outcome,  # type: ignore[arg-type]
    )


def test_the_summary_names_each_reason_with_its_count() -> None:
    metrics = Metrics()
    assert left_out(metrics) == ""
    settings = msgspec.structs.replace(FormatSettings(), only_success=True)
    format_episode = formatter.build(settings, metrics)
    for e in (episode("failure", "thought"), episode("other", "thought"), episode("success")):
        assert format_episode(e) == []
    assert format_episode(episode("success", "thought"))
    assert left_out(metrics) == ", left out: empty 1, not_success 2"
