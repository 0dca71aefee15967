"""``stream-export learn``: the live loop's agents in this process and its trainer
(``stream_export.learn.trainer``) in a child process that has torch, restarted when
it dies, until the trainer reaches its target reward or its last step.

The gateway (in front of a vLLM started in dev mode) and the worker with groups are
running services this command talks to, as in production; ``dev/demo --learn``
starts all of them on one machine.

The trainer's Python: ``--trainer-python``, else ``$STREAM_EXPORT_TRAINER_PYTHON``,
else this interpreter when it imports torch. When it is another environment,
stream-export's own dependencies (aiokafka, msgspec, ...) are taken from this one,
after that environment's own packages, so its torch, numpy and transformers win.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

import stream_export
from stream_export.errors import ConfigError
from stream_export.learn.ledger import Ledger
from stream_export.learn.tasks import load_reward, prompts
from stream_export.settings import Settings

PYTHON_ENV = "STREAM_EXPORT_TRAINER_PYTHON"
#: Runs the trainer module in another environment with this one's packages after its own.
BOOT = (
    "import runpy, sys; root, site = sys.argv.pop(1), sys.argv.pop(1); "
    "sys.path.insert(0, root) if root != site else None; sys.path.append(site); "
    "runpy.run_module('stream_export.learn.trainer', run_name='__main__', alter_sys=True)"
)


def trainer_python(given: str | None) -> str:
    """The Python the trainer runs in (see the module's description)."""
    found = given or os.environ.get(PYTHON_ENV)
    if found:
        return found
    if importlib.util.find_spec("torch") is not None:
        return sys.executable
    raise ConfigError(
        "the trainer needs torch, which this environment lacks: install the trainers "
        f"extra (pip install 'stream-export[trainers]' transformers), or name a Python "
        f"that has it with --trainer-python or {PYTHON_ENV}"
    )


def trainer_command(python: str, args: Sequence[str]) -> list[str]:
    root = str(Path(stream_export.__file__).resolve().parents[1])
    site = sysconfig.get_paths()["purelib"]
    return [python, "-c", BOOT, root, site, *args]


async def served_model(gateway: str) -> str:
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session,
        session.get(f"{gateway}/v1/models") as answer,
    ):
        body = await answer.json()
    name: str = body["data"][0]["id"]
    return name


async def supervise(
    command: list[str], state: Path, restarts: int, log: Any, spawned: asyncio.Event
) -> int:
    """Run the trainer until it exits 0 (target reached) or 3 (last step); restart it
    after any other end (a kill -9 included), at most ``restarts`` times. ``spawned``
    is set once the first process runs (or failed to)."""
    for attempt in range(restarts + 1):
        try:
            process = await asyncio.create_subprocess_exec(*command, stdout=log, stderr=log)
        finally:
            spawned.set()
        (state / "trainer.pid").write_text(str(process.pid))
        try:
            code = await process.wait()
        except asyncio.CancelledError:
            process.kill()
            await process.wait()
            raise
        if code in (0, 3):
            return code
        print(f"stream-export learn: the trainer ended with {code}; restarting", file=sys.stderr)
        if attempt == restarts:
            return code
    return 1


async def agents_for(args: Any, gateway: str) -> Any:
    """The agents (``Agents``); the OpenAI SDK's import takes seconds of CPU, so it
    runs in a thread while the trainer starts."""
    agents = await asyncio.to_thread(importlib.import_module, "stream_export.learn.agents")
    return agents.Agents(
        gateway,
        args.served_model or await served_model(gateway),
        prompts(args.prompts, args.seed),
        load_reward(args.reward),
        group_size=args.group_size,
        max_tokens=args.max_tokens,
    )


async def learn(args: Any, settings: Settings, trainer_args: list[str]) -> int:
    g = settings.gateway
    gateway = (args.gateway or f"http://{g.host}:{g.port}").rstrip("/")
    state = Path(args.state_dir)
    await asyncio.to_thread(state.mkdir, parents=True, exist_ok=True)
    command = trainer_command(trainer_python(args.trainer_python), trainer_args)
    stop = asyncio.Event()
    (state / "serving").unlink(missing_ok=True)
    with (state / "trainer.log").open("ab") as log:
        # the trainer first: its imports and model load are the longest part of the
        # start; the SDK's import holds the GIL for seconds, so it waits for the spawn
        spawned = asyncio.Event()
        trainer = asyncio.create_task(supervise(command, state, args.restarts, log, spawned))
        try:
            await spawned.wait()
            agents = await agents_for(args, gateway)
        except BaseException:
            trainer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await trainer
            raise
        while not (state / "serving").exists():  # the trainer's weights serve: play
            if trainer.done():
                return await trainer
            await asyncio.sleep(0.05)
        playing = asyncio.create_task(agents.run(args.groups_per_step, stop))
        done, _ = await asyncio.wait({trainer, playing}, return_when=asyncio.FIRST_COMPLETED)
        stop.set()
        if playing in done:  # the agents failed: stop the trainer, report
            trainer.cancel()
            await playing
        code = await trainer
        # the trainer acknowledges nothing more, so the gateway refuses the agents'
        # calls (429): their open episodes are left to the gateway's idle timeout
        playing.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await playing
    curve = Ledger.open(state / "ledger.jsonl").curve()
    for version, (mean, count) in curve.items():
        print(json.dumps({"version": version, "mean_reward": round(mean, 4), "rollouts": count}))
    return code
