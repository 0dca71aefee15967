"""New weights into a running vLLM, without a restart (vLLM's dev mode,
``VLLM_SERVER_DEV_MODE=1``: keep it on a private address, its admin routes are
open to whoever reaches it).

``load(url, directory, version)``, called while the trainer's fence holds every
gateway replica (``WeightFence.update``), runs the sequence measured on vLLM
0.32 and guards each of its pitfalls:

1. the checkpoint's safetensors headers (tensor names, dtypes, shapes) must
   match the served model's (``GET /v1/models`` gives its folder; else pass
   ``serving``): a missing tensor leaves meta tensors that kill the engine at the
   next request, a wrongly shaped one makes every later reload fail while the
   server serves corrupt weights. A mismatch is refused before the server is
   touched (WeightLoadError checkpoint_mismatch);
2. ``POST /pause?mode=wait``: calls in flight finish on the old weights, new
   ones queue (``mode=keep`` would let a call finish on new weights over the old
   KV cache, one call mixing versions);
3. ``POST /collective_rpc`` ``reload_weights`` from ``directory`` (a new folder
   per version). A failure leaves the server's weights undefined (its engine
   may be dead): with ``restart`` (a :class:`Restart`) the loader restarts it,
   loads the checkpoint that served before and raises ServerRestartedError;
   without, WeightLoadError reload_failed, the server paused;
4. ``POST /reset_prefix_cache`` (a reload keeps the prefix cache: a repeated
   prompt would then match neither version), ``POST /update_weight_version``;
5. ``POST /resume``.

After a restart the server serves the weights it was started with, so the
loader reloads the previous checkpoint (steps 2-5) rather than the new one that
just failed: the fence then reopens under a version known to load.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from stream_export.contract.calls import WeightVersion
from stream_export.errors import ServerRestartedError, WeightLoadError
from stream_export.weights import checkpoint


@dataclass
class Loaded:
    """A load that went through: the version, and seconds per step."""

    version: WeightVersion
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())


@dataclass(frozen=True)
class Restart:
    """How to bring the server back when a reload fails.

    ``command`` restarts it and returns (``systemctl restart vllm``, a container
    runtime's restart): whatever runs vLLM knows how. ``checkpoint`` holds the
    weights that served before this update, and ``version`` is their version
    (the one the fence began from). ``timeout_s`` bounds the command and the
    wait until the server answers again."""

    command: Sequence[str]
    checkpoint: str | Path
    version: WeightVersion
    timeout_s: float = 600.0


async def load(
    url: str,
    directory: str | Path,
    version: WeightVersion,
    *,
    serving: str | Path | None = None,
    restart: Restart | None = None,
    timeout_s: float = 600.0,
) -> Loaded:
    """Load the checkpoint in ``directory`` into the vLLM at ``url`` (its base URL,
    without ``/v1``) as ``version``; see the module doc. ``serving``: the served
    model's folder, when the server's own (``/v1/models`` root) is not readable
    here. ``restart``: restart the server when the reload fails (then
    ServerRestartedError), instead of leaving it paused (WeightLoadError
    reload_failed)."""
    base = url.rstrip("/").removesuffix("/v1")
    folder = await asyncio.to_thread(Path(directory).resolve)
    loaded = Loaded(version)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        began = time.monotonic()
        served = Path(serving) if serving is not None else await _served_folder(http, base)
        previous = None
        if restart is not None:  # refused now, not found wrong once the server is down
            previous = await asyncio.to_thread(Path(restart.checkpoint).resolve)
            await asyncio.to_thread(checkpoint.check, previous, served)
        await asyncio.to_thread(checkpoint.check, folder, served)  # headers only
        loaded.seconds["check"] = time.monotonic() - began
        try:
            await _reload(http, loaded, base, folder)
        except WeightLoadError as failed:
            if restart is None or previous is None or failed.reason != "reload_failed":
                raise
            await _restart(http, base, restart, previous, failed)
    return loaded


async def _reload(http: aiohttp.ClientSession, loaded: Loaded, base: str, folder: Path) -> None:
    """Steps 2-5 of the module doc: ``folder``'s weights serve as ``loaded.version``."""
    await _step(http, loaded, "pause", f"{base}/pause?mode=wait", None, "server_error")
    rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
    await _step(http, loaded, "reload", f"{base}/collective_rpc", rpc, "reload_failed")
    await _step(http, loaded, "reset", f"{base}/reset_prefix_cache", None, "reload_failed")
    version = {"new_version": str(loaded.version)}
    await _step(http, loaded, "version", f"{base}/update_weight_version", version, "reload_failed")
    await _step(http, loaded, "resume", f"{base}/resume", None, "server_error")


async def _restart(
    http: aiohttp.ClientSession,
    base: str,
    restart: Restart,
    previous: Path,
    failed: WeightLoadError,
) -> None:
    """Run the restart command, wait until the server answers, load ``previous``
    as ``restart.version``; ServerRestartedError when it serves them, else
    WeightLoadError reload_failed (the server's state unknown)."""
    began = time.monotonic()
    command = " ".join(restart.command)
    what = f"{failed.detail}; then the restart ({command})"
    try:
        async with asyncio.timeout(restart.timeout_s):
            await _run(restart.command)
            await _answering(http, base)
    except TimeoutError:
        raise WeightLoadError(
            f"{what} did not bring the server back within {restart.timeout_s:g} s",
            reason="reload_failed",
        ) from None
    except (OSError, WeightLoadError) as exc:
        detail = exc.detail if isinstance(exc, WeightLoadError) else repr(exc)
        raise WeightLoadError(f"{what} failed: {detail}", reason="reload_failed") from None
    back = Loaded(restart.version)
    try:
        await _reload(http, back, base, previous)
    except WeightLoadError as exc:
        raise WeightLoadError(
            f"{what} answered, but reloading {previous} failed: {exc.detail}",
            reason="reload_failed",
        ) from None
    took = time.monotonic() - began
    raise ServerRestartedError(
        f"{what} took {took:.1f} s; it serves {previous} as version {restart.version!r} again",
        serving=restart.version,
    )


async def _run(command: Sequence[str]) -> None:
    """Run ``command``; WeightLoadError with its output's end unless it exits 0."""
    process = await asyncio.create_subprocess_exec(
        *command,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        output, _ = await process.communicate()
    finally:
        if process.returncode is None:  # timed out: leave no restart half-run
            process.kill()
            await process.wait()
    if process.returncode != 0:
        tail = output.decode(errors="replace")[-500:]
        raise WeightLoadError(f"exit {process.returncode}: {tail}", reason="reload_failed")


async def _answering(http: aiohttp.ClientSession, base: str) -> None:
    """Return once ``GET /v1/models`` answers 200 (the caller bounds the wait)."""
    while True:
        try:
            limit = aiohttp.ClientTimeout(total=5)
            async with http.get(f"{base}/v1/models", timeout=limit) as got:
                if got.status == 200:
                    return
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(0.5)


async def _served_folder(http: aiohttp.ClientSession, base: str) -> Path:
    try:
        async with http.get(f"{base}/v1/models") as answer:
            models = await answer.json()
        root = models["data"][0]["root"]
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise WeightLoadError(
            f"cannot tell which model {base} serves ({type(exc).__name__}); pass serving=",
            reason="checkpoint_mismatch",
        ) from None
    return Path(root)


async def _step(
    http: aiohttp.ClientSession,
    loaded: Loaded,
    name: str,
    url: str,
    body: dict[str, Any] | None,
    reason: str,
) -> None:
    """One POST, timed; WeightLoadError ``reason`` unless it answers 200."""
    began = time.monotonic()
    try:
        async with http.post(url, json=body) as answer:
            text = await answer.text()
            status = answer.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        status, text = 0, f"{type(exc).__name__}: {exc}"
    loaded.seconds[name] = time.monotonic() - began
    if status != 200:
        raise WeightLoadError(
            f"{name} ({url}) answered {status or 'nothing'}: {text[:500]}"
            + (" (the server stays paused)" if reason == "reload_failed" else ""),
            reason=reason,
        )
