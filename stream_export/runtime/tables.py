"""A stage's state in Faust tables: the open (windowed) and closed tables, and
their writes, delivered to the changelog before the local store.

The assembler (open episodes, closed-episode markers) and the groups stage (open
groups, closed-group ids) each make their pair with :func:`state_tables` and
write them only through :class:`Changelog`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import suppress
from dataclasses import replace
from functools import partial
from typing import Any, Final

import faust
from faust.serializers import codecs
from faust.types import TP
from faust.windows import TumblingWindow

from stream_export.runtime import pieces
from stream_export.runtime.metrics import Metrics
from stream_export.runtime.outbox import KafkaOutbox
from stream_export.runtime.patches.tables import WindowedTable, partition_of, stored_items
from stream_export.runtime.table_guard import GuardedTable, StaleStatePolicy, add_table
from stream_export.settings import Settings

#: RocksDB per table partition: small memtables, the events are written once.
ROCKSDB: Final = {"write_buffer_size": 8 * 1024 * 1024, "block_cache_size": 32 * 1024 * 1024}
WINDOW_KEY: Final = "stream-export-window-key"
_WINDOW: Final = struct.Struct(">dd")


class _WindowKeyCodec(codecs.Codec):
    """Serialises a windowed key ``(key bytes, (start, end))`` as the key bytes
    followed by start and end (big-endian doubles); Faust's json would need str keys."""

    def _dumps(self, obj: Any) -> bytes:
        key, (start, end) = obj
        return bytes(key) + _WINDOW.pack(start, end)

    def _loads(self, s: bytes) -> Any:
        return s[: -_WINDOW.size], _WINDOW.unpack(s[-_WINDOW.size :])


WINDOW_KEY_CODEC: Final = _WindowKeyCodec()
codecs.register(WINDOW_KEY, WINDOW_KEY_CODEC)


class OpenTable(WindowedTable):
    """The open-episodes table: windowed keys ``(chunk key, window)``, serialised by
    ``_WindowKeyCodec``. A chunk is written once and deleted when its episode
    closes, so its window-expiry bookkeeping (:class:`.adapter.WindowedTable`)
    is as large as the open state."""

    def __init__(self, app: faust.App, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        # Faust derives serializers from key_type (a model's, else json); the
        # store and changelog are made later, from this attribute.
        self.key_serializer = WINDOW_KEY


class Changelog:
    """A stage's table (:class:`.stage.Table`): writes many keys to its changelog
    topic, then its local store, then the table's window-expiry bookkeeping (what
    ``table[key] = value`` does, in the safe order), and reads them back.

    ``table[key] = value`` writes the local store first and sends the changelog
    record through Faust's producer buffer (about 100 us a write here; the
    producer's own send is a quarter of that). After a kill -9 the local RocksDB
    could then hold writes the changelog never got, and the state machine would
    take them as durable. So the records are sent, their delivery awaited, and
    only then applied locally, followed by the persisted changelog offset from
    which RocksDB recovery resumes: the local store never holds what the
    changelog lacks.
    """

    def __init__(self, app: faust.App, table: Any, *, small: bool = False) -> None:
        self.app = app
        self.table = table
        self.outbox = KafkaOutbox(app)
        #: Every value fits one entry (the assembler's markers): written as it is,
        #: without reading what the key held (a read per closed episode otherwise).
        self.small = small

    async def write(self, writes: Mapping[int, Sequence[tuple[Any, bytes | None]]]) -> None:
        """Write (value) or delete (None) each key of each partition of ``writes``
        (stage.TableWriter): every partition's records are sent, their delivery is
        awaited once for all, and only then are they applied to the local store. A
        value over :data:`.pieces.PIECE_BYTES` is stored in pieces, and the pieces a
        key's earlier value left behind are deleted."""
        table = self.table
        topic = table.changelog_topic.get_topic_name()
        dumps_key, key_type, serializer = (
            self.app.serializers.dumps_key,
            table.key_type,
            table.key_serializer,
        )
        store = table.data
        written: dict[int, list[tuple[Any, bytes | None]]] = {}
        for partition, items in writes.items():
            if not items:
                continue
            if self.small:
                entries = [(k, pieces.small(v)) for k, v in items]
            else:
                with partition_of(partition):
                    entries = pieces.entries(items, store.get)
            for key, value in entries:
                raw_key = dumps_key(key_type, key, serializer=serializer)
                await self.outbox.put(topic, partition, raw_key, value)
            written[partition] = entries
        if not written:
            return
        delivered = await self.outbox.delivered()
        expiry = table if isinstance(table, WindowedTable) else None
        for partition, entries in written.items():
            with partition_of(partition):
                for key, value in entries:
                    if value is None:
                        with suppress(KeyError):
                            del store[key]
                        if expiry is not None:
                            expiry.deleted(key, partition)
                    else:
                        store[key] = value
                        if expiry is not None:
                            expiry.stored(key, partition)
            store.set_persisted_offset(TP(topic, partition), delivered[(topic, partition)])

    def read(self, partition: int, key: Any) -> bytes | None:
        """The whole value of ``key`` in ``partition``'s local store (pieces joined)."""
        store = self.table.data
        with partition_of(partition):
            return pieces.join(key, store.get(key), store.get)

    def items(self) -> Iterator[tuple[Any, bytes, list[Any]]]:
        """Every (key, whole value, piece keys) of the local store's active partitions."""
        table = self.table
        if isinstance(table, OpenTable):
            loads = WINDOW_KEY_CODEC.loads
        else:
            loads = partial(
                self.app.serializers.loads_key, table.key_type, serializer=table.key_serializer
            )
        return pieces.whole_items(stored_items(table, loads), table.data.get)

    def expire_only(self, keys: Iterable[tuple[int, Any]]) -> None:
        """Track exactly these (partition, key) pairs for window expiry."""
        if isinstance(self.table, WindowedTable):
            self.table.expire_only(keys)


def state_tables(
    app: faust.App,
    settings: Settings,
    metrics: Metrics,
    *,
    names: tuple[str, str],
    closed_retention_s: float,
    episodes: Callable[[], int] | None,
) -> tuple[OpenTable, GuardedTable, TumblingWindow]:
    """A stage's two tables, guarded against a wiped broker (see table_guard): the
    open one windowed (``assemble.window_s``, expiring ``window_expires_s`` after
    the window ends), the closed one forgetting its markers after
    ``closed_retention_s``; and the window. ``episodes`` counts what the open
    table's local state holds, for the log when it is discarded."""
    a, n = settings.assemble, settings.topics.partitions
    stale = StaleStatePolicy(settings.sink.on_topic_reset, metrics, settings.worker.data_dir)
    open_table = add_table(
        app,
        OpenTable,
        replace(stale, episodes=episodes),
        name=names[0],
        value_type=bytes,
        partitions=n,
        options=ROCKSDB,
    )
    # Windowed keys are read and written through the store (_TableStore,
    # Changelog), so the wrapper's accessors are not used. Faust gives the
    # changelog compact,delete with retention.ms = expires.
    window = TumblingWindow(a.window_s, expires=a.window_expires_s)
    open_table.using_window(window)
    closed_table = add_table(
        app,
        GuardedTable,
        stale,
        name=names[1],
        key_type=bytes,
        value_type=bytes,
        partitions=n,
        options={**ROCKSDB, "ttl": int(closed_retention_s)},
        extra_topic_configs=retention(closed_retention_s),
    )
    return open_table, closed_table, window


def retention(seconds: float) -> dict[str, str]:
    """Changelog topics compact, and drop records older than the backstop expiry."""
    return {"cleanup.policy": "compact,delete", "retention.ms": str(int(seconds * 1000))}
