"""``stream-export gateway``: an OpenAI-compatible proxy that records every call.

Routes (each OpenAI route also under ``/episodes/{episode_id}``, which binds the
call to that episode; without the prefix, the Bearer token binds it when it is
an open episode's id):

  GET  /v1/models                 the first upstream's
  POST /v1/chat/completions       streaming or not, tool calls
  POST /v1/completions
  POST /v1/episodes               start an episode: its id and base URL
  POST /v1/episodes/{id}/end      end it: outcome, reward, metadata
  GET  /metrics, /healthz

A call is answered only after Kafka acknowledged its events (its tool results
and its ``llm_call`` step); ``gateway.on_kafka_down`` says what happens when it
does not in time. New calls are refused before the upstream is asked while the
outboxes hold ``gateway.max_outbox_bytes`` (503), or while the workers lag more
than ``gateway.max_consumer_lag`` or the trainer feed more than
``gateway.max_feed_lag`` (429). A client that leaves while its call waits for
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
from pathlib import Path
from typing import Final

import uvloop
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from stream_export.calls import CallRequest
from stream_export.client import Producer
from stream_export.client.recorder import EpisodeBuilder
from stream_export.config import Settings
from stream_export.errors import (
    ConfigError,
    DecodeError,
    GatewayRefusal,
    GatewayRequestError,
    StartupError,
    StreamExportError,
    UpstreamError,
)
from stream_export.events import StepEvent, encode_event
from stream_export.gateway import wire
from stream_export.gateway.backpressure import Bound, GroupLag
from stream_export.gateway.book import Book, Closed, OpenEpisode, call_events, client_of
from stream_export.gateway.call import REFUSALS, Call, error
from stream_export.gateway.mapping import (
    Endpoint,
    Json,
    Sampled,
    upstream_request,
)
from stream_export.gateway.mapping import call_request as recorded_request
from stream_export.gateway.metrics import GatewayMetrics
from stream_export.gateway.upstream import Upstreams
from stream_export.gateway.wal import EpisodeLog
from stream_export.kafka import lag
from stream_export.kafka.connection import pace_metadata_refreshes
from stream_export.runtime import logs

log = logging.getLogger(__name__)

#: Episode ids: this prefix and 32 random bytes (URL-safe), unguessable.
ID_PREFIX: Final = "ep-"


def read_keys(path: str | None) -> frozenset[str] | None:
    """The client API keys of ``gateway.api_keys_file``: one per line, blank lines and
    ``#`` comments skipped; None when no file is set (no key is checked)."""
    if path is None:
        return None
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read gateway.api_keys_file: {exc}") from None
    keys = frozenset(k.strip() for k in lines if k.strip() and not k.strip().startswith("#"))
    if not keys:
        raise ConfigError(f"gateway.api_keys_file {path} holds no key")
    return keys


class Gateway:
    def __init__(self, settings: Settings, producer: Producer, metrics: GatewayMetrics) -> None:
        self.settings = settings.gateway
        self.max_event_bytes = settings.assemble.max_event_bytes
        self.producer = producer
        self.metrics = metrics
        self.upstreams = Upstreams(self.settings, on_retry=metrics.upstream_retries.inc)
        self.wal = EpisodeLog(self.settings.state_dir)
        self.keys = read_keys(self.settings.api_keys_file)
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
        self.wal.close()

    def web_app(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_request_bytes)
        for prefix in ("", "/episodes/{episode_id}"):
            app.router.add_get(f"{prefix}/v1/models", self.handle_models)
            app.router.add_post(f"{prefix}/v1/chat/completions", self.handle_chat)
            app.router.add_post(f"{prefix}/v1/completions", self.handle_completions)
        app.router.add_post("/v1/episodes", self.handle_start)
        app.router.add_post("/v1/episodes/{episode_id}/end", self.handle_end)
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

    def _admit(self, endpoint: Endpoint | None) -> web.Response | None:
        """The refusal of a new call (an episode start: ``endpoint`` None) while the
        workers lag too far (calls only) or the outboxes are full; None: go ahead."""
        outcome, status = "", 0
        over = self.throttled
        if endpoint is not None and over is not None:
            outcome, status = "throttled", 429
            message = f"{over.who} lag {over.value} events behind; retry later"
        elif self.outbox_bytes >= self.settings.max_outbox_bytes:
            outcome, status = "outbox_full", 503
            message = "too many events wait for Kafka's acknowledgement; retry later"
        if not outcome:
            return None
        if endpoint is not None:
            self.metrics.calls.labels(endpoint, outcome).inc()
        return error(status, message, outcome, **{"Retry-After": str(self.settings.retry_after_s)})

    async def _measure_lag_forever(self, bound: Bound) -> None:
        """Measure a lag every gateway.retry_after_s; unknown when the broker does not
        say (Kafka's own acknowledgement then refuses what cannot be recorded)."""
        while True:
            try:
                bound.measured(await bound.group.measure())
            except (*lag.ERRORS, StreamExportError) as exc:
                lag.unavailable(exc)
                bound.measured(None)
            await asyncio.sleep(self.settings.retry_after_s)

    def _outbox_grew(self, size: int) -> None:
        self.outbox_bytes += size
        self.metrics.outbox_bytes.set(self.outbox_bytes)

    # --- who is calling ----------------------------------------------------------

    def _token(self, request: web.Request) -> str | None:
        header = request.headers.get("Authorization", "")
        return header[7:].strip() if header.startswith("Bearer ") else None

    def _client(self, request: web.Request, also: str | None = None) -> None:
        """Refuse a caller without a client key (or ``also``, an episode's own id)."""
        token = self._token(request)
        if self.keys is not None and token not in self.keys and (also is None or token != also):
            raise GatewayRefusal(401, "unknown API key", reason="invalid_api_key")

    def _episode(self, request: web.Request) -> OpenEpisode:
        """The open episode a call is bound to, by path prefix or by API key."""
        key = request.match_info.get("episode_id")
        if key is not None:
            self._client(request, also=key)
        else:
            key = self._token(request)
            if key not in self.episodes and key not in self.book.closed:
                self._client(request)
                raise GatewayRefusal(
                    400,
                    "bind the call to an episode: base_url .../episodes/{id}/v1, or the "
                    "episode id as api_key (POST /v1/episodes starts one)",
                    reason="episode_required",
                )
        episode = self.episodes.get(key or "")
        if episode is None:
            raise self._not_open(key or "")
        if episode.ended:
            raise GatewayRefusal(409, "the episode has ended", reason="episode_ended")
        episode.active_at = time.time()  # not expired while its call is read
        return episode

    def _not_open(self, key: str) -> GatewayRefusal:
        """The refusal of a call or an end of an episode that is not open: 409 when
        it was closed (ended, or expired), else 404."""
        closed = self.book.closed.get(key)
        if closed is None:
            return GatewayRefusal(404, "no open episode has this id", reason="episode_not_found")
        if closed.expired:
            detail = f"the episode expired: no call for {self.idle_timeout_s:g} s"
            return GatewayRefusal(409, detail, reason="episode_expired")
        return GatewayRefusal(409, "the episode has ended", reason="episode_ended")

    async def _body(self, request: web.Request) -> Json:
        try:
            body = wire.decode(await request.read())
        except web.HTTPRequestEntityTooLarge:
            raise GatewayRefusal(
                413, "the request is too large", reason="request_too_large"
            ) from None
        except ValueError:
            raise GatewayRefusal(400, "the body is not JSON", reason="invalid_json") from None
        if not isinstance(body, dict):
            raise GatewayRefusal(400, "the body is not a JSON object", reason="invalid_json")
        return body

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

    async def record(self, episode: OpenEpisode, request: CallRequest, call: Sampled) -> str:
        """Record one call; its outcome (see GATEWAY_OUTCOMES)."""
        async with episode.lock:
            made = call_events(episode, request, call, weight_version=call.model)
            acked = await self._send(episode, made.events)
        if made.error is not None:
            logs.event(log, "gateway.unrecordable", logging.WARNING, reason=made.error.reason)
            return "rejected"
        if acked:
            self.metrics.tokens.labels("prompt").inc(len(call.prompt_token_ids))
            self.metrics.tokens.labels("completion").inc(len(call.completion_token_ids))
            if call.text_only:
                self.metrics.text_only_calls.inc()
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
            await asyncio.sleep(self.settings.retry_after_s)

    def _close(self, episode: OpenEpisode, outcome: str = "ended") -> None:
        """Forget an open episode, remember it closed: ``outcome`` ended (its end was
        acknowledged), expired (idle) or refused (its start was not acknowledged)."""
        self._outbox_grew(-episode.outbox_bytes())
        episode.outbox, episode.logged = [], 0
        closed = Closed(episode.builder.steps, time.time(), outcome == "expired")
        self.wal.closed(episode.episode_id, dataclasses.asdict(closed))
        for key in self.book.close(episode, closed):
            self.wal.forgotten(key)
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
        try:
            if "episode_id" in request.match_info or self._token(request) in self.episodes:
                self._episode(request)
            else:
                self._client(request)
            status, body, content_type = await self.upstreams.get("/models")
        except GatewayRefusal as refused:
            return error(refused.status, refused.detail, refused.reason)
        except UpstreamError as exc:
            return error(502, str(exc), exc.reason)
        return web.Response(status=status, body=body, content_type=content_type)

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._call(request, "chat", "/chat/completions")

    async def handle_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._call(request, "completions", "/completions")

    async def _call(
        self, request: web.Request, endpoint: Endpoint, path: str
    ) -> web.StreamResponse:
        started = time.monotonic()
        try:
            episode = self._episode(request)
            body = await self._body(request)
            wanted = recorded_request(endpoint, body)
            sent, asked = upstream_request(endpoint, body, tokens=self.settings.capture_tokens)
            if episode.outbox:  # Kafka was away: sample nothing until it is back
                async with episode.lock:
                    if not await self._send(episode, []) and (refusal := self._unacked()):
                        self.metrics.calls.labels(endpoint, "refused").inc()
                        return refusal
            if refusal := self._admit(endpoint):
                return refusal
        except GatewayRefusal as refused:
            return error(refused.status, refused.detail, refused.reason)
        except GatewayRequestError as exc:
            self.metrics.calls.labels(endpoint, "rejected").inc()
            return error(400, exc.detail, exc.reason)
        call = Call(self, request, endpoint, episode, wanted, started)
        with episode.calling():
            if body.get("stream"):
                return await call.stream(path, sent, asked)
            return await call.whole(path, sent, asked)

    async def handle_start(self, request: web.Request) -> web.Response:
        try:
            self._client(request)
            body = await self._body(request)
        except GatewayRefusal as refused:
            return error(refused.status, refused.detail, refused.reason)
        if refusal := self._admit(None):
            self.metrics.episodes.labels("outbox_full").inc()
            return refusal
        client = client_of(self._token(request))
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
                metadata=body.get("metadata"),
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
        base = self.settings.public_url or f"{request.scheme}://{request.host}"
        return web.json_response(
            {"episode_id": key, "base_url": f"{base.rstrip('/')}/episodes/{key}/v1"}
        )

    async def handle_end(self, request: web.Request) -> web.Response:
        key = request.match_info["episode_id"]
        try:
            self._client(request, also=key)
            body = await self._body(request)
        except GatewayRefusal as refused:
            return error(refused.status, refused.detail, refused.reason)
        episode = self.episodes.get(key)
        closed = self.book.closed.get(key)
        if episode is None and closed is not None and not closed.expired:
            return web.json_response({"episode_id": key, "steps": closed.steps})  # a retry
        if episode is None:
            gone = self._not_open(key)
            return error(gone.status, gone.detail, gone.reason)
        async with episode.lock:
            events = []
            if not episode.ended:  # else a retried end: send what is not acknowledged
                try:
                    events.append(
                        episode.builder.end(
                            body.get("outcome") or "other",
                            reward=body.get("reward"),
                            metadata=body.get("metadata"),
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
    """Run the gateway until ``stop`` is set."""
    g = settings.gateway
    pace_metadata_refreshes()  # else a broker restart under load spins the event loop
    async with Producer.from_settings(settings, timeout_s=g.ack_timeout_s, linger_ms=0) as producer:
        gateway = Gateway(settings, producer, GatewayMetrics())
        await gateway.start()
        runner = web.AppRunner(gateway.web_app(), access_log=None, handle_signals=False)
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
            logs.event(log, "gateway.listening", host=g.host, port=g.port, loop=loop.__module__)
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
