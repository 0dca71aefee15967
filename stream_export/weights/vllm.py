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
   per version). A failure leaves the server paused and raises WeightLoadError
   reload_failed: its weights are undefined, so it must be restarted (and the
   last good checkpoint loaded) before the fence is lifted;
4. ``POST /reset_prefix_cache`` (a reload keeps the prefix cache: a repeated
   prompt would then match neither version), ``POST /update_weight_version``;
5. ``POST /resume``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from stream_export.contract.calls import WeightVersion
from stream_export.errors import WeightLoadError
from stream_export.weights import checkpoint


@dataclass
class Loaded:
    """A load that went through: the version, and seconds per step."""

    version: WeightVersion
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def total_s(self) -> float:
        return sum(self.seconds.values())


async def load(
    url: str,
    directory: str | Path,
    version: WeightVersion,
    *,
    serving: str | Path | None = None,
    timeout_s: float = 600.0,
) -> Loaded:
    """Load the checkpoint in ``directory`` into the vLLM at ``url`` (its base URL,
    without ``/v1``) as ``version``; see the module doc. ``serving``: the served
    model's folder, when the server's own (``/v1/models`` root) is not readable
    here."""
    base = url.rstrip("/").removesuffix("/v1")
    folder = await asyncio.to_thread(Path(directory).resolve)
    loaded = Loaded(version)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        began = time.monotonic()
        served = Path(serving) if serving is not None else await _served_folder(http, base)
        await asyncio.to_thread(checkpoint.check, folder, served)  # headers only
        loaded.seconds["check"] = time.monotonic() - began
        await _step(http, loaded, "pause", f"{base}/pause?mode=wait", None, "server_error")
        rpc = {"method": "reload_weights", "kwargs": {"weights_path": str(folder)}}
        await _step(http, loaded, "reload", f"{base}/collective_rpc", rpc, "reload_failed")
        await _step(http, loaded, "reset", f"{base}/reset_prefix_cache", None, "reload_failed")
        await _step(
            http,
            loaded,
            "version",
            f"{base}/update_weight_version",
            {"new_version": str(version)},
            "reload_failed",
        )
        await _step(http, loaded, "resume", f"{base}/resume", None, "server_error")
    return loaded


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
            + ("; the server stays paused: restart it" if reason == "reload_failed" else ""),
            reason=reason,
        )
