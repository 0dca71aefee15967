"""Group records built in memory for the group outputs' unit tests, and their readers."""

from __future__ import annotations

import itertools
import time
from typing import Any

import msgspec

from stream_export.contract.episode import Episode
from stream_export.contract.events import Step
from stream_export.contract.groups import Estimator, GroupRecord
from stream_export.groups.records import group_record
from stream_export.groups.stage import outputs
from stream_export.groups.state import OpenGroup, member_of
from stream_export.ops import demo
from stream_export.rows.formats import SEPARATORS
from stream_export.settings.assemble import AssembleSettings
from stream_export.settings.groups import GroupSettings
from tests.support.assemble_sim import Pipeline

#: The default ``format.text_separator``: what a continuation of a prompt starts with.
SEP = SEPARATORS["blank_line"]
OUTPUTS = outputs(GroupSettings(), SEP)


def rollout(eid: str, reward: float | None, *, truncated: bool = False) -> Episode:
    step = Step(episode_id=eid, time=2.0, seq=0, kind="output", content=f"answer {eid}")
    return Episode(
        episode_id=eid,
        agent_id="a",
        prompt="What is 2 + 2?",
        steps=[step],
        start_time=1.0,
        end_time=2.0,
        outcome="success" if reward else "failure",
        group_id="g",
        reward=reward,
        truncated=truncated,
        truncated_reason="timeout" if truncated else None,
    )


def record(
    rollouts: list[Episode], expected: int | None, estimator: Estimator = "dr_grpo", **close: Any
) -> GroupRecord:
    group = OpenGroup("g", 2.0, expected, [member_of(e, msgspec.json.encode(e)) for e in rollouts])
    args: dict[str, Any] = {"reason": "size", "complete": True, "missing": 0, **close}
    return group_record(
        group,
        rollouts,
        args.pop("reason"),
        closed_at=2.0,
        estimator=estimator,
        eps=1e-6,
        ddof=1,
        **args,
    )


def group(name: str, rollouts: list[Any], **close: Any) -> Any:
    made = record(rollouts, len(rollouts), **close)
    return msgspec.structs.replace(made, group_id=name, record_id=f"{name}/0")


def demo_groups(tasks: int, seed: int = 3) -> list[GroupRecord]:
    """``tasks`` of the demo fleet, each played as a group, assembled as the worker does."""
    scripts = list(itertools.islice(demo.scripts(seed=seed), tasks * demo.ROLLOUTS))
    events = [event for s in scripts for event in demo.events(s, 1_700_000_000.0)]
    pipeline = Pipeline(AssembleSettings())
    pipeline.batch(list(enumerate(events)), wall=time.time())
    assert not pipeline.dead, pipeline.dead
    by_id = {e.episode_id: e for e in pipeline.emitted}
    groups: dict[str, list[Episode]] = {}
    for script in scripts:
        groups.setdefault(script.group_id, []).append(by_id[script.episode_id])
    return [
        msgspec.structs.replace(record(rollouts, demo.ROLLOUTS), group_id=gid)
        for gid, rollouts in groups.items()
    ]
