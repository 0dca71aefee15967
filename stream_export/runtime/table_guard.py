"""Local table state left from a wiped broker: found before Faust's recovery trips on it.

A table partition's local store (RocksDB) remembers the changelog offset it holds
up to. When the broker's data was wiped or the changelog recreated, that offset
is beyond the changelog's end, and Faust's recovery raises ``ConsistencyError``
(``faust.tables.recovery.Recovery._restart_recovery``): the worker crashes with a
traceback, and again on every restart. This check runs first, in the table's
``on_rebalance``, which Faust's ``TableManager.on_rebalance`` awaits for every
table before ``Recovery.on_rebalance`` reads the persisted offsets. By
``sink.on_topic_reset`` it then either stops the worker with one line saying what
to do, or discards the table's local state (Faust then restores the new, empty
changelog) and goes on.

Faust names relied on (issue 12 moves them into one adapter): ``faust.Table`` and
its ``on_rebalance(assigned, revoked, newly_assigned, generation_id)``,
``changelog_topic``, ``data`` (the store: ``persisted_offset``, mapping access, and
RocksDB's ``revoke_partitions``, ``partition_path``, ``assign_partitions``),
``app.consumer.highwaters`` (end offsets) and mode's ``Service.wait_until_stopped``:
public methods, but the order in which Faust calls them is its internals.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import faust
from faust.types import TP

from stream_export.errors import TopicResetError
from stream_export.kafka import reset
from stream_export.runtime import shutdown
from stream_export.runtime.metrics import Metrics

log = logging.getLogger(__name__)

#: Longest wait for the worker to stop after a stop was asked for, before giving
#: up and letting Faust's own error through.
STOP_WAIT_S = 60.0


@dataclass
class StaleStatePolicy:
    """What a guarded table does when its local state is stale."""

    policy: reset.Policy
    metrics: Metrics
    #: Where the local state lives (worker.data_dir), for the error message.
    data_dir: str
    #: How many open episodes the table's local state holds (logged and counted
    #: when discarded); None for tables that hold no episodes.
    episodes: Callable[[], int] | None = None


T = TypeVar("T", bound="GuardedTable")


def add_table(app: faust.App, cls: type[T], stale_state: StaleStatePolicy, **options: Any) -> T:
    """Make and register a guarded table, as ``app.Table`` does for Faust's own."""
    table = cast(T, app.tables.add(cls(app, beacon=app.tables.beacon, **options)))
    table.stale_state = stale_state
    return table


class GuardedTable(faust.Table):  # type: ignore[type-arg]
    """A Faust table that checks its local state against its changelog on every
    assignment (see the module docstring)."""

    stale_state: StaleStatePolicy | None = None

    async def on_rebalance(
        self,
        assigned: set[Any],
        revoked: set[Any],
        newly_assigned: set[Any],
        generation_id: int = 0,
    ) -> None:
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)
        if self.stale_state is not None:
            await self._check_state(assigned, generation_id, self.stale_state)

    async def _check_state(
        self, assigned: set[Any], generation_id: int, how: StaleStatePolicy
    ) -> None:
        topic = self.changelog_topic.get_topic_name()
        tps = {TP(tp.topic, tp.partition) for tp in assigned if tp.topic == topic}
        if not tps:
            return
        persisted = {tp.partition: self.data.persisted_offset(tp) for tp in tps}
        done = {p: offset for p, offset in persisted.items() if offset is not None}
        if not done:
            return
        ends = await self.app.consumer.highwaters(*tps)
        found = reset.detect(topic, done=done, ends={tp.partition: ends[tp] for tp in tps})
        if found is None:
            return
        how.metrics.topic_resets.labels("assemble", how.policy).inc()
        if how.policy == reset.STOP:
            shutdown.stop(
                TopicResetError(
                    found.explain(
                        f"the local table state in {how.data_dir}",
                        "set sink.on_topic_reset=new_epoch to discard it and go on (its open "
                        "episodes are lost), or point worker.data_dir at the right folder",
                    )
                )
            )
            # Hold the rebalance until the worker is stopping, so Faust's recovery
            # never reaches its own check (a crash with a traceback).
            with suppress(TimeoutError):
                await asyncio.wait_for(self.app.wait_until_stopped(), STOP_WAIT_S)
            return
        lost = how.episodes() if how.episodes is not None else None
        self._discard(tps)
        log.warning(
            "assemble: %s; discarded the local state of table %s%s",
            found,
            self.name,
            "" if lost is None else f" ({lost} open episodes lost)",
        )
        if lost:
            how.metrics.reset_episodes_lost.inc(lost)
        store: Any = self.data
        await store.assign_partitions(self, tps, generation_id)

    def _discard(self, tps: set[Any]) -> None:
        """Delete the local store of each partition: the whole topic is a new one, so
        every partition's state is stale, not only those found behind. The store's
        own ``revoke_partitions`` drops the open databases (Faust relies on that to
        reopen a partition's path later, as after any rebalance)."""
        store: Any = self.data
        store.revoke_partitions(self, tps)
        for tp in tps:
            shutil.rmtree(store.partition_path(tp.partition), ignore_errors=True)
