"""What the worker needs from this machine, checked before Faust starts.

Inside Faust each of these is a crash log; here it is one StartupError line that
names the setting and what is wrong (the CLI prints it and exits 2). The same
errors come from the running worker when something changes between this check
and the start (another worker takes the lock, another process the port).
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

from stream_export.errors import StartupError
from stream_export.output.layout import lock_output
from stream_export.settings import Settings


def _writable_folder(path: Path, setting: str, probe_prefix: str) -> None:
    """``path`` is a folder (created with its parents if missing) this process can write;
    the error's reason is the setting's name within its section."""
    reason = setting.rpartition(".")[2]
    if path.exists() and not path.is_dir():
        raise StartupError(f"{setting} {str(path)!r} is not a directory", reason=reason)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StartupError(
            f"{setting} {str(path)!r} cannot be created: {exc.strerror}", reason=reason
        ) from None
    try:
        fd, probe = tempfile.mkstemp(dir=path, prefix=probe_prefix)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise StartupError(
            f"{setting} {str(path)!r} is not writable: {exc.strerror}", reason=reason
        ) from None


def output_dir(settings: Settings) -> None:
    """``sink.output_dir`` exists (created if missing), is writable and no other
    worker writes there under ``sink.prefix``."""
    path = Path(settings.sink.output_dir)
    _writable_folder(path, "sink.output_dir", f".{settings.sink.prefix}.probe-")
    os.close(lock_output(path, settings.sink.prefix, settings.worker.worker_id))


def data_dir(settings: Settings) -> None:
    """``worker.data_dir`` exists (created with its parents: Faust creates only the
    last folder, and crashes with a traceback otherwise) and is writable."""
    _writable_folder(Path(settings.worker.data_dir), "worker.data_dir", ".probe-")


def port_in_use(host: str, port: int, exc: OSError, setting: str = "http.port") -> StartupError:
    """The error for an HTTP address (``setting`` names its port) that cannot be listened on."""
    why = os.strerror(exc.errno) if exc.errno else str(exc)
    return StartupError(
        f"cannot listen on {host}:{port} (http.host, {setting}): {why}; "
        f"stop the process using it or choose another {setting}",
        reason="http_port",
    )


def http_port(settings: Settings) -> None:
    """``http.host``:``http.port`` (and ``http.probe_port``) can be listened on (as
    aiohttp will: SO_REUSEADDR)."""
    h = settings.http
    if not h.enabled:
        return
    ports = {"http.port": h.port, "http.probe_port": h.probe_port}
    for setting, port in ports.items():
        if port is None:
            continue
        try:
            for family, kind, proto, _, address in socket.getaddrinfo(
                h.host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            ):
                with socket.socket(family, kind, proto) as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind(address)
        except OSError as exc:
            raise port_in_use(h.host, port, exc, setting) from None


def worker(settings: Settings) -> None:
    """Everything ``stream-export worker`` can check on this machine, before any Kafka contact."""
    output_dir(settings)
    data_dir(settings)
    http_port(settings)
