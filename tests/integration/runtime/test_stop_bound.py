"""A stop that cannot finish still ends, and a restart writes every episode once.

- Kafka consumers that never finish stopping: the worker exits within the
  README's 10 s of SIGTERM, exit code 0. aiokafka's ``AIOKafkaConsumer.stop``
  waits for the group coordination to end, and mode waits for Faust's consumer
  thread without a bound: one stop that does not return would keep the worker up
  until it is killed.
- Anything else stuck, even the event loop itself: at ``worker.stop_deadline_s``
  the worker prints every thread's stack and exits 1.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from stream_export.settings import Settings
from tests.support.processes import STACKS, Worker
from tests.support.sinkkafka import episode, message, prompts, publish
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

#: The README's bound on the exit after SIGTERM.
SIGTERM_EXIT_S = 10.0
EPISODES = 50

#: The sink's last write never returns, holding the event loop.
STUCK_CLOSE = """
import time
from stream_export.output import writer
def _stuck_close(self):
    time.sleep(3600)
writer.Writer.close = _stuck_close
"""
DEADLINE_S = 5

#: Every consumer's stop, in every thread of the worker, waits forever.
HANGING_STOPS = """
import asyncio, aiokafka
async def _never(self):
    await asyncio.Event().wait()
aiokafka.AIOKafkaConsumer.stop = _never
"""


def stop_after_writing(settings: Settings, log: Path, prelude: str) -> tuple[int, float, str]:
    """Run a worker with ``prelude`` planted until it has written EPISODES records,
    then SIGTERM it: its exit code, seconds to exit, and log."""
    out = Path(settings.sink.output_dir)
    publish(settings, [message(episode(i)) for i in range(EPISODES)])
    worker = Worker(settings, log, prelude=prelude).start()
    try:
        wait_for(
            lambda: sum(prompts(out).values()) == EPISODES,
            timeout=60,
            what=f"{EPISODES} records\n{worker.log()[-3000:]}",
        )
        began = time.monotonic()
        code = worker.stop(timeout=SIGTERM_EXIT_S + 30)
        exited = time.monotonic() - began
    finally:
        worker.stop()
    print(f"{log.stem}: exit code {code} after {exited:.1f}s")
    return code, exited, worker.log()


def restart_writes_every_episode_once(settings: Settings, log: Path) -> None:
    out = Path(settings.sink.output_dir)
    publish(settings, [message(episode(i)) for i in range(EPISODES, 2 * EPISODES)])
    with Worker(settings, log):
        wait_for(lambda: sum(prompts(out).values()) == 2 * EPISODES, timeout=60)
    assert prompts(out) == {f"task {i}": 1 for i in range(2 * EPISODES)}


def test_consumers_that_never_stop_do_not_keep_the_worker_up(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = settings_for("groups.enabled=true")
    code, exited, log = stop_after_writing(settings, tmp_path / "hanging.log", HANGING_STOPS)
    assert code == 0 and exited <= SIGTERM_EXIT_S, (code, exited, log[-4000:])
    assert "assemble: the consumer's stop gave up after" in log
    assert "sink: the consumer's stop gave up after" in log
    restart_writes_every_episode_once(settings, tmp_path / "after.log")


def test_a_stop_stuck_anywhere_ends_at_the_deadline_with_every_stack(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = settings_for(f"worker.stop_deadline_s={DEADLINE_S}")
    code, exited, log = stop_after_writing(settings, tmp_path / "stuck.log", STUCK_CLOSE)
    assert code == 1 and DEADLINE_S <= exited <= DEADLINE_S + 3, (code, exited)
    assert f"Timeout (0:00:0{DEADLINE_S})!" in log and STACKS in log
    assert "in _stuck_close" in log, log[-3000:]
    restart_writes_every_episode_once(settings, tmp_path / "after.log")
