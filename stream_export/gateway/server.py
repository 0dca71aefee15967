"""``stream-export gateway``: an OpenAI-compatible proxy that records every call.

Routes (each OpenAI route also under ``/episodes/{episode_id}``, which binds the
call to that episode; without the prefix and without client keys, the Bearer
token binds it when it is an open episode's id; who may call what:
``stream_export.gateway.access``; what every request passes first:
``stream_export.gateway.edge``):

  GET  /v1/models                 the first upstream's
  POST /v1/chat/completions       streaming or not, tool calls
  POST /v1/completions
  POST /v1/episodes               start an episode: its id and base URL
  POST /v1/episodes/{id}/steps    add the agent's own steps (``.steps``)
  POST /v1/episodes/{id}/end      end it: outcome, reward, metadata
  GET  /metrics, /healthz

A call is answered only after Kafka acknowledged its events (its tool results
and its ``llm_call`` step); ``gateway.on_kafka_down`` says what happens when it
does not in time. New calls are refused before the upstream is asked while the
outboxes hold ``gateway.max_outbox_bytes`` (503), or while the workers lag more
than ``gateway.max_consumer_lag`` or the trainer feed more than
``gateway.max_feed_lag`` (429, after waiting up to ``gateway.retry_after_s`` for
the lag to drop); a lag holds the start of a group of rollouts, never the rest of
one (``stream_export.gateway.admitted``). A client that leaves while its call waits for
Kafka does not stop the recording (aiohttp does not cancel the handler).

Each episode's events are logged in the state directory before they are
produced (``stream_export.gateway.wal``), so a restarted gateway continues its
episodes with the next seq.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import logging.config
import secrets
import signal
import time
from collections.abc import Callable
from typing import Final

import uvloop
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from stream_export.client import Producer
from stream_export.client.recorder import EpisodeBuilder
from stream_export.contract.calls import CallRequest, WeightVersion
from stream_export.contract.decoding import encode_event
from stream_export.contract.events import StepEvent
from stream_export.contract.metadata import flatten
from stream_export.errors import (
    DecodeError,
    FenceError,
    GatewayRefusal,
    GatewayRequestError,
    StartupError,
    StreamExportError,
    UpstreamError,
)
from stream_export.gateway import edge, quota, steps
from stream_export.gateway.access import Access
from stream_export.gateway.admitted import AdmittedGroups
from stream_export.gateway.backpressure import Bound, GroupLag
from stream_export.gateway.book import Book, Closed, OpenEpisode, call_events
from stream_export.gateway.call import REFUSALS, Call, error, upstream_failed
from stream_export.gateway.fence import GatewayFence
from stream_export.gateway.mapping import (
    Endpoint,
    Sampled,
    served_by,
    upstream_request,
)
from stream_export.gateway.mapping import call_request as recorded_request
from stream_export.gateway.metrics import GatewayMetrics
from stream_export.gateway.upstream import Upstreams
from stream_export.gateway.wal import EpisodeLog
from stream_export.kafka import lag
from stream_export.kafka.connection import pace_metadata_refreshes
from stream_export.settings import Settings
from stream_export.telemetry import logs

log = logging.getLogger(__name__)

#: Episode ids: this prefix and 32 random bytes (URL-safe), unguessable.
ID_PREFIX: Final = "ep-"
#: How often at most the lags are measured while calls come (every
#: gateway.retry_after_s without calls).
LAG_RECHECK_S: Final = 0.1


class Gateway:
    def __init__(self, settings: Settings, producer: Producer, metrics: GatewayMetrics) -> None:
        self.settings = settings.gateway
        self.max_event_bytes = settings.assemble.max_event_bytes
        self.producer = producer
        self.metrics = metrics
        self.upstreams = Upstreams(self.settings, on_retry=metrics.upstream_retries.inc)
        self.wal = EpisodeLog(self.settings.state_dir)
        self.access = Access(self.settings)
        self.max_request_bytes = self.settings.max_request_bytes or self.max_event_bytes
        self.edge = edge.Edge(self.settings, self.access, self.max_request_bytes, metrics)
        per_minute = self.settings.calls_per_minute
        self.rate = None if per_minute is None else quota.CallRate(per_minute)
        g, a = self.settings, settings.assemble
        self.book = Book(g.max_open_episodes, g.max_open_episodes_per_key)
        self.episodes = self.book.episodes
        self.idle_timeout_s = g.idle_timeout_s or a.idle_timeout_s + a.grace_s
        #: Bytes in all outboxes (bounded by gateway.max_outbox_bytes).
        self.outbox_bytes = 0
        #: The lags to answer 429 over: the workers', the trainer feed's.
        self.bounds: dict[str, Bound] = {}
        s = self.settings
        if s.max_consumer_lag is not None:
            workers = GroupLag.workers(settings)
            self.bounds["workers"] = Bound(
                "the workers", workers, s.max_consumer_lag, metrics.consumer_lag
            )
        if s.max_feed_lag is not None and s.feed_group is not None:
            feed = GroupLag.feed(settings, s.feed_group)
            self.bounds["trainer"] = Bound("the trainer", feed, s.max_feed_lag, metrics.feed_lag)
        #: Calls waiting for a lag to drop; per lag, set when a call came (measure
        #: it again soon); the event the next measurement sets.
        self._lag_waiters = 0
        self._lag_wanted: list[asyncio.Event] = []
        self._lag_news = asyncio.Event()
        #: The groups whose calls no longer wait on a lag (as many as open episodes).
        self.admitted = AdmittedGroups(g.max_open_episodes)
        #: The weight fence this replica follows (weights.enabled).
        self.fence = GatewayFence(settings, metrics) if settings.weights.enabled else None
        self._tasks: list[asyncio.Task[None]] = []

    # --- lifecycle ------------------------------------------------------------

    async def start(self) -> None:
        """Continue the episodes of the state directory and connect upstream."""
        restored = self.wal.open()
        for key, (state, outbox) in restored.episodes.items():
            episode = OpenEpisode.restore(key, state, outbox, self.max_event_bytes)
            self.book.add(episode)
            self._outbox_grew(episode.outbox_bytes())
        self.book.closed.update((k, Closed(**c)) for k, c in restored.closed.items())
        self.metrics.open_episodes.set(len(self.episodes))
        if self.fence is not None:
            try:
                await self.fence.start()
            except FenceError as exc:
                raise StartupError(
                    f"cannot follow the weight fence (weights.enabled): {exc.detail}",
                    reason="weights",
                ) from None
        await self.upstreams.start()
        self._tasks.append(asyncio.create_task(self._maintain_forever()))
        for bound in self.bounds.values():
            self._tasks.append(asyncio.create_task(self._measure_lag_forever(bound)))
        logs.event(log, "gateway.restored", episodes=len(self.episodes))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for bound in self.bounds.values():
            await bound.group.close()
        await self.upstreams.close()
        if self.fence is not None:
            await self.fence.close()
        self.wal.close()

    def web_app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.max_request_bytes, middlewares=[self.edge.middleware]
        )
        for prefix in ("", "/episodes/{episode_id}"):
            app.router.add_get(f"{prefix}/v1/models", self.handle_models)
            app.router.add_post(f"{prefix}/v1/chat/completions", self.handle_chat)
            app.router.add_post(f"{prefix}/v1/completions", self.handle_completions)
        app.router.add_post("/v1/episodes", self.handle_start)
        app.router.add_post("/v1/episodes/{episode_id}/end", self.handle_end)
        app.router.add_post("/v1/episodes/{episode_id}/steps", self.handle_steps)
        app.router.add_get("/metrics", self.handle_metrics)
        app.router.add_get("/healthz", self.handle_healthz)
        return app

    # --- limits -------------------------------------------------------------------

    @property
    def throttled(self) -> Bound | None:
        """The lag over its bound (gateway.max_consumer_lag, max_feed_lag), if any."""
        return next((b for b in self.bounds.values() if b.exceeded), None)

    def _lag(self, who: str) -> int | None:
        return self.bounds[who].value if who in self.bounds else None

    def _admit(
        self, endpoint: Endpoint | None, client: str = "", lagged: bool = True
    ) -> web.Response | None:
        """The refusal of a new call (an episode start: ``endpoint`` None) while a lag
        is over its bound (calls only, unless ``lagged`` is False: its group was
        admitted), the outboxes are full, or the caller's calls a minute are used up
        (calls only); None: go ahead."""
        outcome, status, retry = "", 0, self.settings.retry_after_s
        over = self.throttled if lagged else None
        if endpoint is not None and over is not None:
            outcome, status = "throttled", 429
            message = f"{over.who} lag {over.value} events behind; retry later"
        elif self.outbox_bytes >= self.settings.max_outbox_bytes:
            outcome, status = "outbox_full", 503
            message = "too many events wait for Kafka's acknowledgement; retry later"
        elif endpoint is not None and self.rate and (wait := self.rate.wait_s(client)):
            outcome, status, retry = "rate_limited", 429, wait
            message = "this API key's calls a minute (gateway.calls_per_minute) are used up"
        if not outcome:
            return None
        if endpoint is not None:
            self.metrics.calls.labels(endpoint, outcome).inc()
        return error(status, message, outcome, **{"Retry-After": str(retry)})

    async def _lag_drops(self, episode: OpenEpisode) -> None:
        """While a lag is over its bound, a new call waits for it to drop, at most
        gateway.retry_after_s (then ``_admit`` refuses it), the lags measured every
        LAG_RECHECK_S meanwhile; a call of an admitted group does not wait. A refused
        client comes back only after Retry-After: a second or more after the trainer
        or the workers caught up. Each call has the lags measured again within
        LAG_RECHECK_S: measured every retry_after_s only, the agents ran seconds past
        a bound before it held them."""
        for wanted in self._lag_wanted:
            wanted.set()
        if self.throttled is None or self._covered(episode):
            return
        self._lag_waiters += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.retry_after_s):
                    while self.throttled is not None and not self._covered(episode):
                        await self._lag_news.wait()
        finally:
            self._lag_waiters -= 1

    def _covered(self, episode: OpenEpisode) -> bool:
        """Whether the episode's group was admitted: its calls do not wait on a lag."""
        return self.admitted.covers(episode.builder.group_id, episode.episode_id)

    def _admitted(self, episode: OpenEpisode, covered: bool) -> None:
        """A call of the episode went through: its group (an episode started with
        ``group_id`` and ``group_size``) is admitted, and its calls held for a lag
        are woken (nothing to remember without a lag bound)."""
        group_id, size = episode.builder.group_id, episode.builder.group_size
        if group_id is None or size is None or not self.bounds:
            return
        if covered and self.throttled is not None:
            self.metrics.group_calls.inc()
        dropped = self.admitted.admit(group_id, size, episode.episode_id, time.time())
        self.metrics.admitted_groups_dropped.inc(dropped)
        self.metrics.admitted_groups.set(len(self.admitted))
        if not covered and self._lag_waiters:
            self._wake_held()

    def _wake_held(self) -> None:
        """Wake the calls waiting for a lag to drop (or for their group)."""
        news, self._lag_news = self._lag_news, asyncio.Event()
        news.set()

    async def _measure_lag_forever(self, bound: Bound) -> None:
        """Measure a lag every gateway.retry_after_s, every LAG_RECHECK_S while calls
        come or wait for a lag to drop; unknown when the broker does not say (Kafka's
        own acknowledgement then refuses what cannot be recorded)."""
        wanted = asyncio.Event()
        self._lag_wanted.append(wanted)
        while True:
            try:
                bound.measured(await bound.group.measure())
            except (*lag.ERRORS, StreamExportError) as exc:
                lag.unavailable(exc)
                bound.measured(None)
            self._wake_held()
            if not self._lag_waiters:
                wanted.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.retry_after_s):
                    await wanted.wait()
                    await asyncio.sleep(LAG_RECHECK_S)

    def _outbox_grew(self, size: int) -> None:
        self.outbox_bytes += size
        self.metrics.outbox_bytes.set(self.outbox_bytes)

    # --- who is calling ----------------------------------------------------------

    def _token(self, request: web.Request) -> str | None:
        header = request.headers.get("Authorization", "")
        return header[7:].strip() if header.startswith("Bearer ") else None

    def _caller(self, request: web.Request) -> str | None:
        """The fingerprint of the caller's client key; None with keys off (401 with
        keys on and no client key)."""
        return self.access.caller(self._token(request))

    def _owned(self, key: str, caller: str | None) -> OpenEpisode:
        """The open episode ``key`` names, if ``caller`` may use it (403 if not; 409
        if it was closed: ended, or expired; else 404)."""
        episode = self.episodes.get(key)
        if episode is not None:
            self.access.check_owner(episode.client, caller)
            return episode
        closed = self.book.closed.get(key)
        if closed is None:
            raise GatewayRefusal(404, "no open episode has this id", reason="episode_not_found")
        self.access.check_owner(closed.client, caller)
        if closed.expired:
            detail = f"the episode expired: no call for {self.idle_timeout_s:g} s"
            raise GatewayRefusal(409, detail, reason="episode_expired")
        raise GatewayRefusal(409, "the episode has ended", reason="episode_ended")

    def _episode(self, request: web.Request) -> OpenEpisode:
        """The open episode a call is bound to: by path prefix, or (without client
        keys) by the episode id as API key."""
        caller = self._caller(request)
        key = request.match_info.get("episode_id")
        if key is None:
            key = self._token(request)
            known = key in self.episodes or key in self.book.closed
            if self.access.keys is not None or not known:
                raise GatewayRefusal(
                    400,
                    "bind the call to an episode: base_url .../episodes/{id}/v1 (or, "
                    "without client keys, the episode id as api_key); POST /v1/episodes "
                    "starts one",
                    reason="episode_required",
                )
        episode = self._owned(key or "", caller)
        if episode.ended:
            raise GatewayRefusal(409, "the episode has ended", reason="episode_ended")
        episode.active_at = time.time()  # not expired while its call is read
        return episode

    # --- recording ------------------------------------------------------------------

    async def _send(self, episode: OpenEpisode, events: list[StepEvent]) -> bool:
        """Log then produce the episode's outbox and these events (the episode's lock
        held): whether Kafka acknowledged them all within gateway.ack_timeout_s."""
        added = [encode_event(e, max_bytes=self.max_event_bytes) for e in events]
        episode.outbox += added
        self._outbox_grew(sum(map(len, added)))
        if not episode.outbox:
            return True
        if episode.logged < len(episode.outbox):
            unlogged = episode.outbox[episode.logged :]
            try:
                await self.wal.state(episode.episode_id, episode.state(), unlogged)
            except OSError:  # logged by the log: refused, and logged again next time
                return False
            episode.logged = len(episode.outbox)
        acked = await self.producer.deliver(
            episode.episode_id.encode(), episode.outbox, self.settings.ack_timeout_s
        )
        if acked:
            self._outbox_grew(-episode.outbox_bytes())
            episode.outbox, episode.logged = [], 0
            self.wal.acked(episode.episode_id)
        return acked

    def _unacked(self) -> web.Response | None:
        """The answer when Kafka did not acknowledge: a 503 (refuse), or None (answer)."""
        if self.settings.on_kafka_down == "answer":
            return None
        return self.refusal("refused")

    def refusal(self, outcome: str) -> web.Response | None:
        """The error answered instead of a call with this outcome, if any."""
        if outcome not in REFUSALS:
            return None
        status, message, code = REFUSALS[outcome]
        headers = {"Retry-After": str(self.settings.retry_after_s)} if status == 503 else {}
        return error(status, message, code, **headers)

    async def record(
        self,
        episode: OpenEpisode,
        request: CallRequest,
        call: Sampled,
        stamp: WeightVersion | None = None,
    ) -> str:
        """Record one call; its outcome (see GATEWAY_OUTCOMES). Its weight version:
        the upstream's own, else the fence's ``stamp``, else the model name."""
        version = served_by(call, stamp)
        async with episode.lock:
            made = call_events(episode, request, call, weight_version=version)
            acked = await self._send(episode, made.events)
        if made.error is not None:
            logs.event(log, "gateway.unrecordable", logging.WARNING, reason=made.error.reason)
            return "rejected"
        if acked:
            self.metrics.tokens.labels("prompt").inc(len(call.prompt_token_ids))
            self.metrics.tokens.labels("completion").inc(len(call.completion_token_ids))
            if call.text_only:
                self.metrics.text_only_calls.inc()
            self.metrics.version_calls.labels(str(version)).inc()
            return "recorded"
        if self.settings.on_kafka_down == "refuse":
            return "refused"
        self.metrics.unrecorded_calls.inc()
        logs.event(log, "gateway.unrecorded", logging.WARNING, episode_id=episode.episode_id)
        return "unrecorded"

    async def _maintain_forever(self) -> None:
        """Every gateway.retry_after_s: send the outboxes Kafka has not acknowledged
        again (ended episodes get no further call that would), close the episodes
        idle past gateway.idle_timeout_s, forget closed ones as old."""
        while True:
            for episode in list(self.episodes.values()):
                if episode.outbox and not episode.lock.locked():
                    async with episode.lock:
                        acked = await self._send(episode, [])
                    if acked and episode.ended:
                        self._close(episode)
            before = time.time() - self.idle_timeout_s
            idle = self.book.idle(before)
            for episode in idle:
                self._close(episode, "expired")
            if idle:
                logs.event(log, "gateway.expired", episodes=len(idle))
            for key in self.book.forget(before=before):
                self.wal.forgotten(key)
            if self.admitted.forget(before):
                self.metrics.admitted_groups.set(len(self.admitted))
            await asyncio.sleep(self.settings.retry_after_s)

    def _close(self, episode: OpenEpisode, outcome: str = "ended") -> None:
        """Forget an open episode, remember it closed: ``outcome`` ended (its end was
        acknowledged), expired (idle) or refused (its start was not acknowledged)."""
        self._outbox_grew(-episode.outbox_bytes())
        episode.outbox, episode.logged = [], 0
        steps, at = episode.builder.steps, time.time()
        closed = Closed(steps, at, expired=outcome == "expired", client=episode.client)
        self.wal.closed(episode.episode_id, dataclasses.asdict(closed))
        for key in self.book.close(episode, closed):
            self.wal.forgotten(key)
        self.admitted.ended(episode.builder.group_id, episode.episode_id)
        self.metrics.admitted_groups.set(len(self.admitted))
        self.metrics.episodes.labels(outcome).inc()
        self.metrics.open_episodes.set(len(self.episodes))

    # --- handlers -----------------------------------------------------------------

    async def handle_metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def handle_healthz(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "status": "alive",
                "open_episodes": len(self.episodes),
                "outbox_bytes": self.outbox_bytes,
                "consumer_lag": self._lag("workers"),
                "feed_lag": self._lag("trainer"),
                "throttled": self.throttled is not None,
            }
        )

    async def handle_models(self, request: web.Request) -> web.Response:
        bound = self.access.keys is None and self._token(request) in self.episodes
        if bound or "episode_id" in request.match_info:
            self._episode(request)
        else:
            self._caller(request)
        try:
            status, body, content_type = await self.upstreams.get("/models")
        except UpstreamError as exc:
            return upstream_failed(exc)
        return web.Response(status=status, body=body, content_type=content_type)

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._call(request, "chat", "/chat/completions")

    async def handle_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._call(request, "completions", "/completions")

    async def _call(
        self, request: web.Request, endpoint: Endpoint, path: str
    ) -> web.StreamResponse:
        started = time.monotonic()
        episode = self._episode(request)
        body = await self.edge.body(request)
        try:
            wanted = recorded_request(endpoint, body, max_bytes=self.max_event_bytes)
            body = quota.capped(body, self.settings.max_tokens_per_call)
            tokens = self.settings.capture_tokens
            text_only = tokens and self.upstreams.refuses_fields(episode.episode_id)
            sent, asked = upstream_request(endpoint, body, tokens=tokens and not text_only)
            plain = upstream_request(endpoint, body, tokens=False)[0] if tokens else None
        except GatewayRequestError as exc:
            self.metrics.calls.labels(endpoint, "rejected").inc()
            return error(413 if exc.reason == "call_too_large" else 400, exc.detail, exc.reason)
        if episode.outbox:  # Kafka was away: sample nothing until it is back
            async with episode.lock:
                if not await self._send(episode, []) and (refusal := self._unacked()):
                    self.metrics.calls.labels(endpoint, "refused").inc()
                    return refusal
        await self._lag_drops(episode)
        covered = self._covered(episode)
        if refusal := self._admit(endpoint, episode.client, lagged=not covered):
            return refusal
        self._admitted(episode, covered)
        stamp: WeightVersion | None = None
        if self.fence is not None:
            stamp, refusal = await self.fence.admit()
            if refusal is not None:
                self.metrics.calls.labels(endpoint, "fenced").inc()
                return refusal
        call = Call(self, request, endpoint, episode, wanted, started, plain, stamp)
        call.lost = "fields_refused" if text_only else None
        with episode.calling(), self._in_flight(call.stop):
            if body.get("stream"):
                return await call.stream(path, sent, asked)
            return await call.whole(path, sent, asked)

    def _in_flight(self, stop: Callable[[], None]) -> contextlib.AbstractContextManager[None]:
        """A call a weight fence waits for, or stops (nothing without one)."""
        return self.fence.calling(stop) if self.fence is not None else contextlib.nullcontext()

    async def handle_start(self, request: web.Request) -> web.Response:
        client = self._caller(request) or ""
        body = await self.edge.body(request)
        if refusal := self._admit(None):
            self.metrics.episodes.labels("outbox_full").inc()
            return refusal
        if full := self.book.full(client):
            self.metrics.episodes.labels(full).inc()
            message = "too many open episodes (gateway.max_open_episodes"
            message += "_per_key); retry later" if full.endswith("key") else "); retry later"
            return error(503, message, full, **{"Retry-After": str(self.settings.retry_after_s)})
        key = ID_PREFIX + secrets.token_urlsafe(32)
        try:
            builder = EpisodeBuilder(
                episode_id=key,
                agent_id=body.get("agent_id") or "",
                prompt=body.get("prompt") or body.get("task") or "",
                group_id=body.get("group_id"),
                group_size=body.get("group_size"),
                metadata=flatten(body.get("metadata")),
                max_event_bytes=self.max_event_bytes,
            )
            start = builder.start()
        except (DecodeError, TypeError, ValueError) as exc:
            return error(400, f"cannot start the episode: {exc}", "invalid_episode")
        builder.prompt, builder.metadata = "", {}  # in the start event: not kept
        episode = OpenEpisode(builder, client=client, active_at=time.time())
        self.book.add(episode)
        self.metrics.open_episodes.set(len(self.episodes))
        async with episode.lock:
            acked = await self._send(episode, [start])
        if not acked and (refusal := self._unacked()):
            self._close(episode, "refused")  # nobody knows its id; if it lands, it times out
            return refusal
        self.metrics.episodes.labels("started").inc()
        base = self.settings.public_url or edge.own_url(request)
        return web.json_response(
            {"episode_id": key, "base_url": f"{base.rstrip('/')}/episodes/{key}/v1"}
        )

    async def handle_steps(self, request: web.Request) -> web.Response:
        """Add a batch of the agent's own steps (``stream_export.gateway.steps``)."""
        episode = self._owned(request.match_info["episode_id"], self._caller(request))
        counted = self.metrics.steps
        try:
            batch = steps.parse(await self.edge.body(request))
            async with episode.lock:
                repeat = steps.answered_before(episode, batch) is not None
                if not repeat and (refusal := self._admit(None)):
                    counted.labels("refused").inc()
                    return refusal
                answer, made = steps.take(episode, batch)
                episode.active_at = time.time()
                acked = await self._send(episode, made)
        except GatewayRefusal:
            counted.labels("rejected").inc()
            raise
        if not acked and (refusal := self._unacked()):
            counted.labels("refused").inc()
            return refusal
        counted.labels("repeated" if repeat else "recorded").inc()
        return web.json_response(answer)

    async def handle_end(self, request: web.Request) -> web.Response:
        key = request.match_info["episode_id"]
        try:
            episode = self._owned(key, self._caller(request))
        except GatewayRefusal as refused:
            if refused.reason != "episode_ended":
                raise
            steps = self.book.closed[key].steps
            return web.json_response({"episode_id": key, "steps": steps})  # a retry
        body = await self.edge.body(request)
        async with episode.lock:
            events = []
            if not episode.ended:  # else a retried end: send what is not acknowledged
                try:
                    events.append(
                        episode.builder.end(
                            body.get("outcome") or "other",
                            reward=body.get("reward"),
                            metadata=flatten(body.get("metadata")),
                        )
                    )
                except (DecodeError, TypeError, ValueError) as exc:
                    return error(400, f"cannot end the episode: {exc}", "invalid_end")
            acked = await self._send(episode, events)
        if acked and key in self.episodes:
            self._close(episode)
        elif not acked and (refusal := self._unacked()):
            return refusal
        return web.json_response({"episode_id": key, "steps": episode.builder.steps})


async def serve(settings: Settings, stop: asyncio.Event) -> None:
    """Run the gateway until ``stop`` is set. A connection has gateway.header_timeout_s
    to send a request's headers (aiohttp's keep-alive timeout runs from its opening
    and from each answer, and closes it while no whole request has arrived)."""
    g = settings.gateway
    pace_metadata_refreshes()  # else a broker restart under load spins the event loop
    async with Producer.from_settings(settings, timeout_s=g.ack_timeout_s, linger_ms=0) as producer:
        gateway = Gateway(settings, producer, GatewayMetrics())
        await gateway.start()
        runner = web.AppRunner(
            gateway.web_app(),
            access_log=None,
            handle_signals=False,
            keepalive_timeout=g.header_timeout_s,
        )
        await runner.setup()
        try:
            try:
                await web.TCPSite(runner, g.host, g.port).start()
            except OSError as exc:
                raise StartupError(
                    f"cannot listen on {g.host}:{g.port} (gateway.host, gateway.port): {exc}",
                    reason="http_port",
                ) from None
            loop = type(asyncio.get_running_loop())
            logs.event(
                log,
                "gateway.listening",
                host=g.host,
                port=g.port,
                loop=loop.__module__,
                open_files=edge.raise_open_files_limit(),
            )
            await stop.wait()
        finally:
            await runner.cleanup()
            await gateway.close()


def run(settings: Settings) -> None:
    """``stream-export gateway``: serve until SIGTERM or SIGINT, on uvloop (its
    parsing and socket work in C take about a third off each call's CPU)."""
    logging.config.dictConfig(logs.logging_config(settings))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await serve(settings, stop)

    uvloop.run(main())
