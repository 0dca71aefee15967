"""Two real workers sharing one output directory (a sink.prefix each): a killed
worker's partitions move to the other, which writes each episode once."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from stream_export.output.layout import read_checkpoint
from stream_export.settings import Settings
from tests.support.processes import Worker
from tests.support.sinkkafka import episode, message, prompts, publish
from tests.support.topic_reader import committed_offsets
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


def done(out: Path, prefix: str, partitions: int, total: int) -> bool:
    """Whether the writer's checkpoint covers every one of ``total`` messages."""
    ckpt = read_checkpoint(out, prefix)
    offsets = ckpt.offsets if ckpt else {}
    return len(offsets) == partitions and sum(o + 1 for o in offsets.values()) == total


def test_episodes_published_again_after_a_kill_9_are_written_once_by_the_new_owner(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """Issue 25 item 6: the killed worker's assembler had published episodes it had
    not persisted, so they are published again (same ids, later offsets; here
    published by hand). The worker that takes the partitions over resumes after
    the killed one's checkpoint and must drop them, though it never wrote them."""

    def worker(name: str) -> Settings:
        return settings_for(
            # A killed worker's partitions move to the other after 6 s.
            "worker.session_timeout_s=6",
            f"worker.worker_id={name}",
            f"worker.data_dir={tmp_path / name}",
            f"sink.prefix={name}",
        )

    a, b = worker("a"), worker("b")  # the same topics, group and output_dir
    out = Path(a.sink.output_dir)
    first = [message(episode(i)) for i in range(40)]
    publish(a, first)
    with Worker(a, tmp_path / "a.log") as killed:
        wait_for(
            lambda: prompts(out, "a") == Counter(f"task {i}" for i in range(40)),
            timeout=60,
            what=lambda: f"a to write 40 episodes\n{killed.log()[-3000:]}",
        )
        killed.kill9()
    publish(a, [*first, *(message(episode(i)) for i in range(40, 60))])
    with Worker(b, tmp_path / "b.log") as survivor:
        wait_for(
            lambda: done(out, "b", a.topics.partitions, 100),
            timeout=90,
            what=lambda: f"b to read all 100 messages\n{survivor.log()[-3000:]}",
        )
    assert prompts(out, "b") == Counter(f"task {i}" for i in range(40, 60))
    assert prompts(out, "a") == Counter(f"task {i}" for i in range(40))


def test_a_new_owner_with_an_older_checkpoint_never_moves_the_committed_offset_back(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """Issue 36 item 2: workers with folders of their own. b wrote the first
    batch, a the second; b, given the partitions back, starts them after a's
    rows, but its own checkpoint is older. It must never commit that older
    position: killed within a second of the assignment and restarted, it would
    start there and write the second batch a second time."""

    def worker(name: str) -> Settings:
        return settings_for(
            "worker.session_timeout_s=6",
            f"worker.worker_id={name}",
            f"worker.data_dir={tmp_path / name}",
            f"sink.output_dir={tmp_path / f'out-{name}'}",
        )

    a, b = worker("a"), worker("b")
    out_a, out_b = Path(a.sink.output_dir), Path(b.sink.output_dir)
    group, parts = f"{a.worker.app_id}-sink", a.topics.partitions
    batches = [[message(episode(i)) for i in range(n, n + 20)] for n in (0, 20, 40)]
    publish(b, batches[0])
    with Worker(b, tmp_path / "b.log") as first:
        wait_for(lambda: done(out_b, "training-data", parts, 20), timeout=60, what=first.log)
    publish(a, batches[1])
    with Worker(a, tmp_path / "a.log") as second:  # after b's session: all partitions
        wait_for(lambda: done(out_a, "training-data", parts, 40), timeout=60, what=second.log)
    before = committed_offsets(a.kafka.bootstrap_servers, group, a.topics.episodes)
    assert sum(before.values()) == 40
    back = Worker(b, tmp_path / "b2.log").start()
    try:
        wait_for(
            lambda: "starts at offset" in back.log(),
            timeout=60,
            what=lambda: f"b to take the partitions\n{back.log()[-3000:]}",
        )
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:  # the first second after the assignment
            now = committed_offsets(a.kafka.bootstrap_servers, group, a.topics.episodes)
            assert all(now.get(p, -1) >= at for p, at in before.items()), (before, now)
    finally:
        back.kill9()
    publish(b, batches[2])
    with Worker(b, tmp_path / "b3.log") as again:
        wait_for(
            lambda: prompts(out_b)["task 59"] == 1,
            timeout=60,
            what=lambda: f"b to write the third batch\n{again.log()[-3000:]}",
        )
    assert prompts(out_a) == Counter(f"task {i}" for i in range(20, 40))
    assert prompts(out_b) == Counter(f"task {i}" for i in (*range(20), *range(40, 60)))
