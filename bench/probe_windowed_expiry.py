"""What Faust's windowed-table expiry holds in memory, and what the assembler's
open-episodes table (``runtime.tables.OpenTable``) holds for the same writes.

    python -m bench.probe_windowed_expiry [--bootstrap HOST:PORT] [--keys 50000]

Writes every key of a ``tumbling(3600, expires=3 days)`` table twice from one
event and prints what Faust then holds for expiry: one heap entry per write
(``_partition_timestamps``) and every live key (``_partition_timestamp_keys``),
both kept until the window expires; as a backstop days after our own timeout
that is every write of days of traffic. Then the same writes through
``OpenTable``'s bookkeeping: one heap entry per window.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from typing import Any

import faust
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from stream_export.runtime.tables import OpenTable


async def _topic(bootstrap: str, name: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 1, 1)])
    finally:
        await admin.close()


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.probe_windowed_expiry")
    p.add_argument(
        "--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:29092")
    )
    p.add_argument("--keys", type=int, default=50_000)
    args = p.parse_args()
    name = f"probe-windowed-{uuid.uuid4().hex[:8]}"
    asyncio.run(_topic(args.bootstrap, name))
    app = faust.App(
        name,
        broker=f"kafka://{args.bootstrap}",
        store="memory://",
        topic_partitions=1,
        web_enabled=False,
        autodiscover=False,
    )
    source = app.topic(name, key_serializer="raw", value_serializer="raw")
    table = app.Table("probe", default=int, partitions=1).tumbling(3600, expires=3 * 24 * 3600)

    @app.agent(source)
    async def write(stream: Any) -> None:
        async for _ in stream:
            for value in (1, 2):
                for i in range(args.keys):
                    table[f"episode-{i}"] = value
            raw: Any = table.table  # the private expiry bookkeeping is the point
            heap = sum(len(h) for h in raw._partition_timestamps.values())
            keys = sum(len(s) for s in raw._partition_timestamp_keys.values())
            print(
                f"faust: {2 * args.keys} writes to {args.keys} keys: {heap} expiry heap "
                f"entries and {keys} keys held in memory until the window expires",
                flush=True,
            )
            ours = OpenTable(app, name="probe-ours", value_type=bytes, partitions=1)
            ours.using_window(raw.window)
            window = raw.window.current(time.time())
            for _ in (1, 2):
                for i in range(args.keys):
                    ours._maybe_set_key_ttl((f"episode-{i}".encode(), window), 0)
            heap = sum(len(h) for h in ours._partition_timestamps.values())
            keys = sum(len(s) for s in ours._partition_timestamp_keys.values())
            print(
                f"OpenTable: the same writes: {heap} expiry heap entries and {keys} keys "
                "(a key leaves when it is deleted, as every chunk is when its episode closes)",
                flush=True,
            )
            os._exit(0)

    async def trigger() -> None:
        await source.send(key=b"go", value=b"go")

    app.task(trigger)
    faust.Worker(
        app, loglevel="info", quiet=True, redirect_stdouts=False
    ).execute_from_commandline()


if __name__ == "__main__":
    main()
