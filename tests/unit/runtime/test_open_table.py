"""The open-episodes table's windowed keys and window-expiry bookkeeping, run
through Faust's own expiry (``_del_old_keys``) on a memory store."""

from __future__ import annotations

import asyncio
import time

import faust
from faust.windows import TumblingWindow

from stream_export.runtime.tables import WINDOW_KEY, OpenTable

WINDOW = TumblingWindow(10, expires=100)


def table() -> OpenTable:
    app = faust.App("open-table-test", store="memory://", autodiscover=False)
    t = OpenTable(app, name="open", value_type=bytes, partitions=2)
    t.using_window(WINDOW)
    return t


def test_windowed_keys_round_trip_through_the_codec() -> None:
    t = table()
    key = (b"episode-1\x00\x00\x00\x00\x02", (1200.0, 1209.9))
    raw = t.app.serializers.dumps_key(t.key_type, key, serializer=t.key_serializer)
    assert raw is not None and raw[:-16] == key[0] and len(raw) == len(key[0]) + 16
    assert t.app.serializers.loads_key(t.key_type, raw, serializer=WINDOW_KEY) == key


def test_one_heap_entry_per_window_and_expiry_deletes_only_stale_windows() -> None:
    t = table()
    now = time.time()
    old = WINDOW.current(now - 1000)  # long past the 100 s expiry
    new = WINDOW.current(now)
    for p in (0, 1):
        for n in range(500):
            for window in (old, new):
                key = (b"e%d-%d" % (p, n), window)
                t.data[key] = b"chunk"
                t._maybe_set_key_ttl(key, p)
    # Faust's own bookkeeping would hold 1000 heap entries per partition.
    assert {p: sorted(h) for p, h in t._partition_timestamps.items()} == {
        0: [old[1], new[1]],
        1: [old[1], new[1]],
    }
    gone = (b"e0-7", new)
    del t.data[gone]
    t._maybe_del_key_ttl(gone, 0)
    assert gone not in t._partition_timestamp_keys[(0, new[1])]

    asyncio.run(t._del_old_keys())
    assert sorted(t.data.keys()) == sorted(
        (b"e%d-%d" % (p, n), new) for p in (0, 1) for n in range(500) if (p, n) != (0, 7)
    )


def test_restored_keys_are_tracked_again_after_a_restart() -> None:
    t = table()
    old = WINDOW.current(time.time() - 1000)
    t.data[(b"restored", old)] = b"chunk"  # as recovery writes it: no bookkeeping
    asyncio.run(t._del_old_keys())
    assert len(t.data) == 1  # Faust alone would never expire it
    t.expire_only([(0, (b"restored", old))])
    asyncio.run(t._del_old_keys())
    assert len(t.data) == 0
