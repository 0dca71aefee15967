"""Why the assembler does not use Faust windowed tables: their expiry costs memory.

    python -m bench.probe_windowed_expiry [--bootstrap HOST:PORT] [--keys 50000]

Writes every key of a ``tumbling(3600, expires=3 days)`` table twice from one
event and prints what Faust then holds in memory for expiry: one heap entry per
write (``_partition_timestamps``) and every live key (``_partition_timestamp_keys``),
both kept until the window expires. As the backstop the issue asks for (expiry
days after our own timeout) that is every write and every key of days of traffic.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import uuid
from typing import Any

import faust
from aiokafka.admin import AIOKafkaAdminClient, NewTopic


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
                f"{2 * args.keys} writes to {args.keys} keys: {heap} expiry heap entries and "
                f"{keys} keys held in memory until the window expires",
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
