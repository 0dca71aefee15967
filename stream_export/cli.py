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

    settings = _settings(args)
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


def cmd_follow(args: argparse.Namespace) -> int:
    from stream_export import follow

    prefix = args.prefix or _settings(args).sink.prefix
    return follow.main(args.dir, prefix, args.position, wait=not args.once)


def cmd_export(args: argparse.Namespace) -> int:
    from stream_export import export

    settings = _settings(args)
    if args.format:
        settings.format.format = args.format
    return asyncio.run(
        export.run(
            settings,
            args.to,
            since=export.parse_time(args.since),
            until=export.parse_time(args.until),
            progress=not args.quiet,
        )
    )


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

    f = sub.add_parser(
        "follow",
        parents=[common],
        help="print every record of an output directory once, across rotations",
    )
    f.add_argument("dir", help="the sink's output directory")
    f.add_argument("--prefix", help="file prefix (default: sink.prefix)")
    f.add_argument("--position", metavar="FILE", help="resume from and save the position here")
    f.add_argument("--once", action="store_true", help="exit when caught up instead of waiting")
    f.set_defaults(func=cmd_follow)

    e = sub.add_parser(
        "export",
        parents=[common],
        help="replay the episodes topic from the beginning into a file or a directory",
    )
    e.add_argument(
        "--to", required=True, help="output file, or a directory (ending in /) for rotated files"
    )
    e.add_argument("--format", help="record format (default: format.format)")
    e.add_argument("--since", help="only episodes ending at or after (ISO 8601 or Unix seconds)")
    e.add_argument("--until", help="only episodes ending before (ISO 8601 or Unix seconds)")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    e.set_defaults(func=cmd_export)
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
