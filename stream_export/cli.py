"""The ``stream-export`` command line. Each subcommand is a thin shell over a module."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from stream_export import config, topics
from stream_export.errors import StreamExportError


def _settings(args: argparse.Namespace) -> config.Settings:
    overrides = list(args.set or [])
    if args.bootstrap_servers:
        overrides.append(f"kafka.bootstrap_servers={args.bootstrap_servers}")
    return config.load(file=args.config, overrides=overrides)


def cmd_worker(args: argparse.Namespace) -> int:
    from stream_export import worker
    from stream_export.app import check_kafka

    settings = _settings(args)
    asyncio.run(check_kafka(settings))
    asyncio.run(topics.ensure(settings))
    print(
        f"stream-export worker: reading {settings.topics.steps!r} on "
        f"{settings.kafka.bootstrap_servers}, writing under {settings.sink.output_dir!r}",
        file=sys.stderr,
        flush=True,
    )
    worker.run(settings)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from stream_export import demo

    settings = _settings(args)
    asyncio.run(topics.ensure(settings))
    sent = asyncio.run(
        demo.run(
            settings.kafka.bootstrap_servers,
            settings.topics.steps,
            rate=args.rate,
            count=args.count,
            seed=args.seed,
        )
    )
    print(f"stream-export demo: sent {sent} episodes", file=sys.stderr)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="stream-export", description=__doc__)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="TOML settings file (or STREAM_EXPORT_CONFIG)")
    common.add_argument(
        "--set",
        action="append",
        metavar="SECTION.FIELD=VALUE",
        help="override one setting; repeatable",
    )
    common.add_argument("--bootstrap-servers", help="shortcut for --set kafka.bootstrap_servers=")
    sub = p.add_subparsers(dest="command", required=True)

    w = sub.add_parser("worker", parents=[common], help="run the Faust worker")
    w.set_defaults(func=cmd_worker)

    d = sub.add_parser("demo", parents=[common], help="run simulated agents")
    d.add_argument("--rate", type=float, default=20.0, help="episodes per second (0: no pause)")
    d.add_argument("--count", type=int, default=None, help="stop after this many episodes")
    d.add_argument("--seed", type=int, default=None)
    d.set_defaults(func=cmd_demo)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return int(args.func(args))
    except StreamExportError as exc:
        print(f"stream-export: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
