"""Rewards at the float limit through a worker and the verl export: the group is
written by every group output, the metrics stay finite, the export succeeds."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from prometheus_client.parser import text_string_to_metric_families

from stream_export.settings import Settings
from tests.support.groups import files, records, rollout
from tests.support.monitoring import free_port, get
from tests.support.processes import Worker, export
from tests.support.sinkkafka import message, publish
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

BIG = sys.float_info.max
#: Their sum overflows; mean BIG/3, centred 2/3, 2/3, -4/3 BIG, sample std 2/sqrt(3)
#: BIG (beyond the floats: clamped to BIG), GRPO advantages 1/sqrt(3), 1/sqrt(3), -2/sqrt(3).
HUGE = [BIG, BIG, -BIG]


def test_rewards_at_the_float_limit_make_a_group_every_output_writes(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    port = free_port()
    settings = settings_for("groups.enabled=true", "http.enabled=true", f"http.port={port}")
    now = time.time()
    huge = [rollout("g-huge", i, now + i, reward, 3) for i, reward in enumerate(HUGE)]
    after = [rollout("g-after", i, now + i, float(i), 2) for i in range(2)]
    out = Path(settings.sink.output_dir)
    #: Rows per output of the huge group, and of both groups.
    wanted = {"groups": 1, "rollouts": 3, "preference": 1, "kto": 3, "prompts": 1}
    both = {"groups": 2, "rollouts": 5, "preference": 2, "kto": 5, "prompts": 2}

    def written(counts: dict[str, int]) -> bool:
        return all(len(files(out, name)) >= count for name, count in counts.items())

    with Worker(settings, tmp_path / "worker.log") as worker:
        publish(settings, [message(e) for e in huge])
        wait_for(
            lambda: written(wanted),
            timeout=90,
            what=lambda: f"the rows of every output {wanted}\n{worker.log()[-3000:]}",
        )
        publish(settings, [message(e) for e in after])  # the groups agent goes on
        wait_for(lambda: written(both), timeout=60, what="the next group's rows")
        metrics = get(f"http://127.0.0.1:{port}/metrics")[1].decode()
        assert worker.alive()
    samples = [s for f in text_string_to_metric_families(metrics) for s in f.samples]
    assert [s.name for s in samples if not math.isfinite(s.value)] == []
    [spread] = [s.value for s in samples if s.name == "stream_export_group_reward_spread_sum"]
    assert spread == 1e12 + 1.0  # 2 * BIG overflows: observed as the cap; g-after's 1.0
    [record] = records(settings, 1, 10.0)["g-huge"]
    assert (record.mean, record.std) == (float(Fraction(BIG) / 3), BIG)
    third = 1 / math.sqrt(3)
    got = {e.episode_id: a for e, a in zip(record.rollouts, record.advantages, strict=True)}
    want = {"g-huge-r0": third, "g-huge-r1": third, "g-huge-r2": -2 * third}
    assert got == pytest.approx(want, rel=1e-12)
    of_huge = {
        name: [r for r in files(out, name) if r.get("group_id", r.get("uid")) == "g-huge"]
        for name in wanted
    }
    assert {name: len(rows) for name, rows in of_huge.items()} == wanted
    [pair] = of_huge["preference"]
    assert (pair["chosen_reward"], pair["rejected_reward"], pair["margin"]) == (BIG, -BIG, BIG)

    target = tmp_path / "verl.parquet"
    done = export(settings, "--to", str(target), "--quiet")
    assert done.returncode == 0, done.stderr
    rows = {r["extra_info"]["group_id"]: r for r in pq.read_table(target).to_pylist()}
    assert rows["g-huge"]["extra_info"]["mean_reward"] == float(Fraction(BIG) / 3)
