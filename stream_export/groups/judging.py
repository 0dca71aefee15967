"""The group judge's I/O: one asyncio task per group being judged, outside the
groups stage's per-message logic (a partition never waits for a judge).

A task asks the judge (:mod:`.judge` builds the request and reads the answer) up to
``groups.judge_attempts`` times with exponential backoff, then sends its verdict
(the scores, or that it gave up) onto the repartition topic, to the group's
partition, where the groups stage reads it in order like any rollout and applies
the first one (:meth:`~.state.GroupBook.judged`). A task that dies with its worker
is started again by the rebuild of whoever owns the partition next (its book still
has the group being judged), and a second verdict for a group is ignored: a group
is published with the scores of one verdict, whatever happens.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Final

import aiohttp
import msgspec

from stream_export.errors import JudgeError
from stream_export.groups import judge
from stream_export.groups.state import OpenGroup
from stream_export.runtime.metrics import Metrics
from stream_export.settings import Settings

log = logging.getLogger(__name__)

#: Sends one verdict (partition, key, value, headers) and waits for its delivery.
Post = Callable[[int, bytes, bytes, list[tuple[str, bytes]]], Awaitable[None]]
#: The largest judge answer read (a few scores; anything larger is no answer of ours).
MAX_ANSWER_BYTES: Final = 1 << 20


class JudgeTasks:
    """The judge tasks of one worker, by (partition, group id)."""

    def __init__(self, settings: Settings, metrics: Metrics, post: Post) -> None:
        self.settings, self.metrics, self.post = settings, metrics, post
        self.tasks: dict[tuple[int, str], asyncio.Task[None]] = {}
        self.slots = asyncio.Semaphore(settings.groups.judge_concurrency)

    def start(self, partition: int, group: OpenGroup) -> None:
        """Judge ``group`` of ``partition``, unless a task does already."""
        key = (partition, group.group_id)
        running = self.tasks.get(key)
        if running is not None and not running.done():
            return
        task = asyncio.create_task(self._judge(partition, group))
        self.tasks[key] = task
        task.add_done_callback(lambda done: self._forget(key, done))

    async def run(self) -> None:
        """Held while the worker runs (a Faust task): when it stops, the judge calls
        in flight are cancelled, not left to die with the event loop; the rebuild of
        whoever owns the partitions next judges those groups again."""
        try:
            await asyncio.Event().wait()
        finally:
            self.keep(())

    def keep(self, partitions: Iterable[int]) -> None:
        """Cancel the tasks of every partition but ``partitions`` (revoked ones)."""
        kept = set(partitions)
        for (p, _group), task in list(self.tasks.items()):
            if p not in kept:
                task.cancel()

    def _forget(self, key: tuple[int, str], done: asyncio.Task[None]) -> None:
        if self.tasks.get(key) is done:
            del self.tasks[key]

    async def _judge(self, partition: int, group: OpenGroup) -> None:
        group_id = group.group_id
        try:
            ids, body = judge.group_request(group, self.settings)
        except Exception as exc:  # a bug must cost one group's score, never the group
            log.exception("groups: building the judge's request for group %r", group_id)
            scores, attempts, error = None, 0, f"{type(exc).__name__}: {exc}"
        else:
            async with self.slots:
                scores, attempts, error = await self._ask(group_id, ids, body)
        verdict = judge.Verdict(
            group_id=group_id, time=time.time(), scores=scores, attempts=attempts, error=error
        )
        value = msgspec.json.encode(verdict)
        headers = [(judge.VERDICT_HEADER, b"1")]
        delay = self.settings.groups.judge_backoff_s
        while True:  # until delivered: the group waits for it
            try:
                await self.post(partition, group_id.encode(), value, headers)
                return
            except Exception:
                log.exception("groups: sending the verdict of group %r; trying again", group_id)
                await asyncio.sleep(delay)
                delay = min(2 * delay, self.settings.groups.judge_backoff_max_s)

    async def _ask(
        self, group_id: str, ids: list[str], body: Any
    ) -> tuple[dict[str, float] | None, int, str]:
        """The scores by episode id (None: every attempt failed), attempts, last error."""
        g, m = self.settings.groups, self.metrics
        if not ids:
            return {}, 0, ""
        delay, error = g.judge_backoff_s, ""
        for attempt in range(1, g.judge_attempts + 1):
            started = time.monotonic()
            try:
                scores = await self._call(body, len(ids))
            except JudgeError as exc:
                error = exc.detail
            else:
                m.group_judge_calls.labels("ok").inc()
                m.group_judge_seconds.observe(time.monotonic() - started)
                return dict(zip(ids, scores, strict=True)), attempt, ""
            m.group_judge_seconds.observe(time.monotonic() - started)
            m.group_judge_calls.labels("failed").inc()
            log.warning("groups: judging group %r, attempt %d: %s", group_id, attempt, error)
            if attempt < g.judge_attempts:
                await asyncio.sleep(delay)
                delay = min(2 * delay, g.judge_backoff_max_s)
        m.group_judge_calls.labels("gave_up").inc()
        log.warning("groups: group %r is published without the judge's score", group_id)
        return None, g.judge_attempts, error

    async def _call(self, body: Any, n: int) -> list[float]:
        """One request: the scores, or JudgeError."""
        g = self.settings.groups
        url = f"{(g.judge_url or '').rstrip('/')}/chat/completions"
        headers = {}
        if g.judge_api_key is not None:
            headers["Authorization"] = f"Bearer {g.judge_api_key.reveal()}"
        timeout = aiohttp.ClientTimeout(total=g.judge_timeout_s)
        try:  # a session per call: calls are seconds apart, and nothing is left to close
            async with (
                aiohttp.ClientSession(timeout=timeout) as session,
                session.post(url, json=body, headers=headers) as answer,
            ):
                data = await answer.content.read(MAX_ANSWER_BYTES)
                if answer.status != 200:
                    text = data[:200].decode(errors="replace")
                    raise JudgeError(f"the judge answered HTTP {answer.status}: {text}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise JudgeError(f"the judge could not be asked: {type(exc).__name__}: {exc}") from None
        return judge.parse(data, n)
