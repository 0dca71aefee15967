"""The ``stream-export`` command line. Each subcommand is a thin shell over a module."""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

from stream_export import __version__
from stream_export.contract.topics import SCHEMA_DIR, spec_dir, stale_schemas, write_schemas
from stream_export.errors import ConfigError, StreamExportError
from stream_export.kafka import topics
from stream_export.settings import Settings, load, sources

DESCRIPTION = """\
Turn LLM-agent step events on Kafka into GRPO training data: agents publish one
message per step to the steps topic, the worker assembles each episode and
appends it as a JSONL record ({"prompt": ..., "completion": ...} by default) to
rotating files that trainers read.

Every command takes its settings from defaults < a TOML file (--config) <
STREAM_EXPORT_<SECTION>_<FIELD> variables < --set section.field=value;
`stream-export config list` lists them all."""

EXAMPLES = """\
examples:
  stream-export worker --bootstrap-servers kafka:9092 --set sink.output_dir=/data
      run the worker; /metrics and a status page on http://127.0.0.1:9108/
  stream-export gateway --set gateway.upstreams=http://vllm:8000/v1
      record every call of agents pointed at http://127.0.0.1:9180/v1
  stream-export demo --rate 5 --count 100
      send 100 simulated episodes to the steps topic
  stream-export produce episodes.jsonl --dry-run
      check a file of step events (one JSON object per line), send nothing
  stream-export follow /data --position /data/.reader
      print every record once, across file rotations, and keep waiting
  stream-export export --to grpo.jsonl --format conversational --since 2026-01-01
      replay the episodes topic into one file
  stream-export learn --model DIR --vllm http://127.0.0.1:8000
      train the model live on agents' episodes (the live loop; docs: live-loop.md)
  stream-export config show --config prod.toml
      the settings in effect, secrets as ***, and where each came from
  stream-export topics check
      compare the topics on the broker with topics/*.toml

exit codes: 0 ok, 1 check failed or bad input lines, 2 bad settings or start-up error"""


def _settings(args: argparse.Namespace) -> Settings:
    return load(file=args.config, overrides=_overrides(args))


def _overrides(args: argparse.Namespace) -> list[str]:
    overrides = list(args.set or [])
    if args.bootstrap_servers:
        overrides.append(f"kafka.bootstrap_servers={args.bootstrap_servers}")
    return overrides


def _stacks_on_sigquit() -> None:
    """``kill -QUIT`` prints every thread's stack to stderr and the process goes on:
    a worker or gateway that does not stop can be read before it is killed. A C
    handler, so it answers even when the event loop is stuck."""
    faulthandler.register(signal.SIGQUIT, all_threads=True)


def cmd_worker(args: argparse.Namespace) -> int:
    from stream_export.runtime import compat

    _stacks_on_sigquit()
    settings = _settings(args)
    compat.check()  # before importing the worker, which imports the private names
    from stream_export.kafka.connection import check_kafka
    from stream_export.ops import preflight, worker

    preflight.worker(settings)
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


def cmd_gateway(args: argparse.Namespace) -> int:
    from stream_export.gateway import access, server
    from stream_export.kafka.connection import check_kafka

    _stacks_on_sigquit()
    settings = _settings(args)
    access.Access(settings.gateway)  # a bad key file or a keyless exposure fails before Kafka
    asyncio.run(check_kafka(settings))
    asyncio.run(topics.ensure(settings))
    g = settings.gateway
    print(
        f"stream-export gateway: http://{g.host}:{g.port}/v1 -> {', '.join(g.upstreams)}, "
        f"recording to {settings.topics.steps!r} on {settings.kafka.bootstrap_servers}",
        file=sys.stderr,
        flush=True,
    )
    server.run(settings)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from stream_export.client import Producer
    from stream_export.ops import demo

    settings = _settings(args)
    asyncio.run(topics.ensure(settings))
    sent = asyncio.run(
        demo.run(Producer.from_settings(settings), rate=args.rate, count=args.count, seed=args.seed)
    )
    print(f"stream-export demo: sent {sent} episodes", file=sys.stderr)
    return 0


def cmd_produce(args: argparse.Namespace) -> int:
    from stream_export.client import producer as client

    settings = _settings(args)
    name = "<stdin>" if args.file == "-" else args.file

    def bad_line(number: int, error: StreamExportError) -> None:
        print(f"stream-export produce: {name}:{number}: {error}", file=sys.stderr, flush=True)

    async def produce(stream: BinaryIO) -> client.ProduceReport:
        lines = client.read_lines(stream, interactive=args.file == "-")
        options = {
            "on_error": args.on_error,
            "max_bytes": settings.assemble.max_event_bytes,
            "on_bad_line": bad_line,
        }
        if args.dry_run:
            return await client.produce_lines(None, lines, **options)
        async with client.Producer.from_settings(settings) as producer:
            return await client.produce_lines(producer, lines, **options)

    if args.file == "-":
        report = asyncio.run(produce(sys.stdin.buffer))
    else:
        try:
            with open(args.file, "rb") as stream:
                report = asyncio.run(produce(stream))
        except OSError as exc:
            raise ConfigError(f"cannot read {args.file}: {exc}") from None
    verb = "checked" if args.dry_run else f"sent to {settings.topics.steps!r}"
    print(
        f"stream-export produce: {report.sent} events {verb}, bad lines: {len(report.bad)}"
        + (
            f"; stopped at line {report.stopped_at}, nothing after it was sent"
            if report.stopped_at is not None
            else ""
        ),
        file=sys.stderr,
    )
    return 1 if report.bad else 0


def cmd_topics(args: argparse.Namespace) -> int:
    if args.action == "schemas":
        directory = Path(args.dir) if args.dir else spec_dir() / SCHEMA_DIR
        if args.check:
            stale = stale_schemas(directory)
            for name in stale:
                print(f"stale: {directory / name} (run stream-export topics schemas)")
            return 1 if stale else 0
        for name in write_schemas(directory):
            print(f"wrote {directory / name}")
        return 0
    settings = _settings(args)
    statuses = asyncio.run(topics.apply(settings, create=args.action == "apply"))
    print(topics.render(statuses))
    if args.action == "check":
        return 0 if all(s.state == "ok" for s in statuses) else 1
    return 1 if any(d.fatal for s in statuses for d in s.drift) else 0


def cmd_follow(args: argparse.Namespace) -> int:
    from stream_export.output import follow

    prefix = args.prefix or _settings(args).sink.prefix
    return follow.main(args.dir, prefix, args.position, wait=not args.once)


def cmd_export(args: argparse.Namespace) -> int:
    from stream_export.kafka.connection import check_kafka
    from stream_export.ops import export

    settings = _settings(args)
    asyncio.run(check_kafka(settings))
    if args.format:
        settings.format.format = args.format
    return asyncio.run(
        export.run(
            settings,
            args.to,
            since=export.parse_time(args.since),
            until=export.parse_time(args.until),
            progress=not args.quiet,
            with_scores=args.with_scores,
        )
    )


def cmd_learn(args: argparse.Namespace) -> int:
    from stream_export.learn import command as learn

    settings = _settings(args)
    trainer = [
        *("--model", args.model, "--vllm", args.vllm, "--state-dir", args.state_dir),
        *("--feed-group", args.feed_group, "--groups-per-step", str(args.groups_per_step)),
        *("--target", str(args.target), "--window", str(args.group_size * args.groups_per_step)),
        *("--max-steps", str(args.max_steps), "--loss", args.loss),
        *(["--vllm-restart", args.vllm_restart] if args.vllm_restart else []),
        *(["--vllm-restart-timeout-s", str(t)] if (t := args.vllm_restart_timeout_s) else []),
        *(["--config", args.config] if args.config else []),
        *(a for o in _overrides(args) for a in ("--set", o)),
    ]
    return asyncio.run(learn.learn(args, settings, trainer))


def cmd_config(args: argparse.Namespace) -> int:
    from stream_export.settings import docs

    if args.action == "list":
        print(docs.render_list(), end="")
        return 0
    settings = _settings(args)
    if args.json:
        print(json.dumps(settings.redacted(), indent=2, ensure_ascii=False))
        return 0
    where = sources(file=args.config, overrides=_overrides(args))
    print(docs.render_effective(settings, where), end="")
    return 0


def _sub(
    sub: Any,
    name: str,
    help: str,
    examples: str = "",
    **kw: Any,
) -> argparse.ArgumentParser:
    """A subcommand whose --help starts with its one-line help and ends with examples."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help,
        description=help[0].upper() + help[1:] + ".",
        epilog=f"examples:\n{examples}" if examples else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        **kw,
    )
    return parser


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="stream-export",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"stream-export {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", help="TOML settings file (or STREAM_EXPORT_CONFIG)")
    common.add_argument(
        "--set",
        action="append",
        metavar="SECTION.FIELD=VALUE",
        help="override one setting; repeatable",
    )
    common.add_argument("--bootstrap-servers", help="shortcut for --set kafka.bootstrap_servers=")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    w = _sub(
        sub,
        "worker",
        "run the worker: steps topic -> episodes -> JSONL files, with /metrics, "
        "/healthz, /readyz and a status page",
        "  stream-export worker --bootstrap-servers kafka:9092 --set sink.output_dir=/data\n"
        "  STREAM_EXPORT_FORMAT_FORMAT=conversational stream-export worker --config prod.toml",
        parents=[common],
    )
    w.set_defaults(func=cmd_worker)

    gw = _sub(
        sub,
        "gateway",
        "run the capture gateway: an OpenAI-compatible proxy in front of vLLM that records "
        "every call token for token to the steps topic before answering it",
        "  stream-export gateway --set gateway.upstreams=http://vllm:8000/v1\n"
        "  STREAM_EXPORT_GATEWAY_API_KEYS_FILE=/etc/keys stream-export gateway --config prod.toml",
        parents=[common],
    )
    gw.set_defaults(func=cmd_gateway)

    d = _sub(
        sub,
        "demo",
        "run simulated agents that send dark-room and cellar episodes to the steps topic",
        "  stream-export demo --rate 5 --count 100 --seed 1",
        parents=[common],
    )
    d.add_argument("--rate", type=float, default=20.0, help="episodes per second (0: no pause)")
    d.add_argument("--count", type=int, default=None, help="stop after this many episodes")
    d.add_argument("--seed", type=int, default=None, help="random seed, for repeatable runs")
    d.set_defaults(func=cmd_demo)

    pr = _sub(
        sub,
        "produce",
        "check JSONL step events and send them to the steps topic",
        "  stream-export produce episodes.jsonl --dry-run\n"
        "  my-agent | stream-export produce - --on-error skip",
        parents=[common],
    )
    pr.add_argument("file", metavar="FILE|-", help="one JSON event per line; - reads stdin")
    pr.add_argument(
        "--on-error",
        choices=["stop", "skip"],
        default="stop",
        help="at a bad line: stop (send nothing after it) or skip it and go on; "
        "either way it is reported with its line number and the exit code is 1",
    )
    pr.add_argument("--dry-run", action="store_true", help="only check the lines, send nothing")
    pr.set_defaults(func=cmd_produce)

    t = _sub(
        sub,
        "topics",
        "create and check topics from the specs in topics/",
        "  stream-export topics check --bootstrap-servers kafka:9092\n"
        "  stream-export topics apply\n"
        "  stream-export topics schemas --check",
    )
    actions = t.add_subparsers(dest="action", required=True)
    actions.add_parser(
        "apply",
        parents=[common],
        help="create missing topics, report drift, change nothing else (exit 1: fatal drift)",
    )
    actions.add_parser("check", parents=[common], help="report missing topics and drift (exit 1)")
    schemas = actions.add_parser("schemas", help="regenerate the JSON Schemas from the code")
    schemas.add_argument("--check", action="store_true", help="exit 1 if they are stale")
    schemas.add_argument("--dir", help="where the schemas live (default: topics/schemas)")
    t.set_defaults(func=cmd_topics)

    f = _sub(
        sub,
        "follow",
        "print every record of an output directory once, across rotations",
        "  stream-export follow /data --once > snapshot.jsonl\n"
        "  stream-export follow /data --position /data/.reader | my-trainer",
        parents=[common],
    )
    f.add_argument("dir", help="the sink's output directory")
    f.add_argument("--prefix", help="file prefix (default: sink.prefix)")
    f.add_argument("--position", metavar="FILE", help="resume from and save the position here")
    f.add_argument("--once", action="store_true", help="exit when caught up instead of waiting")
    f.set_defaults(func=cmd_follow)

    e = _sub(
        sub,
        "export",
        "replay the episodes topic from the beginning into a file or a directory",
        "  stream-export export --to grpo.jsonl --format conversational\n"
        "  stream-export export --to out/ --since 2026-01-01T00:00:00Z --until 1767312000",
        parents=[common],
    )
    e.add_argument(
        "--to", required=True, help="output file, or a directory (ending in /) for rotated files"
    )
    e.add_argument("--format", help="record format (default: format.format)")
    e.add_argument("--since", help="only episodes ending at or after (ISO 8601 or Unix seconds)")
    e.add_argument("--until", help="only episodes ending before (ISO 8601 or Unix seconds)")
    e.add_argument("--quiet", action="store_true", help="no progress bar")
    e.add_argument(
        "--with-scores",
        action="store_true",
        help="join the scores that came after each episode (the scores output's topic)",
    )
    e.set_defaults(func=cmd_export)

    lr = _sub(
        sub,
        "learn",
        "run the live loop: agents on the OpenAI SDK play a prompt set through the gateway, "
        "the reference trainer steps on their closed groups and loads each new version "
        "into vLLM behind the weight fence",
        "  stream-export learn --model ./tiny --vllm http://127.0.0.1:8000\n"
        "  stream-export learn --model M --vllm URL --prompts tasks.jsonl --reward my.mod:score",
        parents=[common],
    )
    lr.add_argument("--model", required=True, help="the served model's folder (transformers)")
    lr.add_argument("--vllm", required=True, help="the vLLM server (dev mode) the gateway calls")
    lr.add_argument(
        "--prompts",
        help="a prompt set: JSON lines with prompt, or text lines "
        "(default: a fresh five-word prompt for every group)",
    )
    lr.add_argument(
        "--reward",
        default="stream_export.learn.tasks:digit_reward",
        help="module:function given the episode, answering a float (None: an "
        "outside verifier sends a score event)",
    )
    lr.add_argument("--gateway", help="the gateway's URL (default: gateway.host and .port)")
    lr.add_argument(
        "--served-model",
        help="the model name to ask for (default: the first of the gateway's /v1/models)",
    )
    lr.add_argument(
        "--state-dir",
        default=".stream-export-learn",
        help="checkpoints, the trainer's ledger and log",
    )
    lr.add_argument(
        "--feed-group",
        default="trainer",
        help="the trainer feed's consumer group "
        "(set gateway.feed_group to it for the gateway's backpressure)",
    )
    lr.add_argument("--group-size", type=int, default=8, help="rollouts per prompt")
    lr.add_argument(
        "--groups-per-step",
        type=int,
        default=4,
        help="groups in a training step, and groups the agents play at once",
    )
    lr.add_argument("--max-tokens", type=int, default=12, help="per completion")
    lr.add_argument(
        "--target",
        type=float,
        default=0.8,
        help="stop once the rollouts one version served reach this mean reward",
    )
    lr.add_argument("--max-steps", type=int, default=40, help="stop after this many versions")
    lr.add_argument(
        "--loss",
        choices=("decoupled", "ppo"),
        default="decoupled",
        help="the trainer's loss: decoupled (stale rollouts weighted by their importance "
        "weight) or ppo (clipped against the recorded logprobs)",
    )
    lr.add_argument(
        "--trainer-python",
        help="a Python with torch and transformers "
        "(default: $STREAM_EXPORT_TRAINER_PYTHON, else this one)",
    )
    lr.add_argument(
        "--vllm-restart",
        metavar="COMMAND",
        help="a command (split like a shell's) that restarts vLLM at the same URL when "
        "a reload fails; vLLM then serves the version before and the trainer loads the "
        "new one again (default: a failed reload leaves the fence closed)",
    )
    lr.add_argument(
        "--vllm-restart-timeout-s",
        type=float,
        help="for the restart command and vLLM to answer again (default: the trainer's, 600)",
    )
    lr.add_argument("--restarts", type=int, default=5, help="restarts of a trainer that died")
    lr.add_argument("--seed", type=int, default=None, help="for the order of the prompts")
    lr.set_defaults(func=cmd_learn)

    c = _sub(
        sub,
        "config",
        "show the settings in effect, or list every setting with its type, default, "
        "bounds and environment variable",
        "  stream-export config show --config prod.toml --set sink.fsync=flush\n"
        "  stream-export config show --json\n"
        "  stream-export config list | grep -A3 rotate_bytes",
    )
    views = c.add_subparsers(dest="action", required=True)
    show = views.add_parser(
        "show",
        parents=[common],
        help="the effective settings as TOML (secrets as ***), with where each came from",
    )
    show.add_argument("--json", action="store_true", help="print JSON instead of TOML")
    views.add_parser("list", help="every setting: type, default, allowed values, env name")
    c.set_defaults(func=cmd_config)
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
