"""Who may use the gateway, and from where (pure, no I/O but the key file).

* Client keys (``gateway.api_keys_file``): with keys on, every request but
  ``/metrics`` and ``/healthz`` carries one as its Bearer token, and an episode
  belongs to the key that started it: its calls, ``/models`` under its prefix and
  its end need that same key. An episode id is never a credential then (it shows
  in records, logs and status pages). With keys off the episode id is the
  capability to use its episode, as the path prefix or as the Bearer token.
* Exposure: a gateway that listens beyond loopback without keys refuses to start
  unless ``gateway.allow_without_keys`` says it is meant.
* Browsers: a POST must be ``application/json`` (a page on another origin can
  send that only after a CORS preflight, which the gateway never grants: no
  blind CSRF), and without client keys the Host must be an IP address,
  ``localhost``, ``gateway.public_url``'s host or one of
  ``gateway.allowed_hosts`` (a DNS rebinding attack always arrives with its own
  name; with keys it gains nothing: a page cannot send a key it does not hold).
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

from stream_export.errors import ConfigError, GatewayRefusal, StartupError
from stream_export.settings.gateway import GatewaySettings

#: Names that always mean this machine (RFC 6761); IP addresses are allowed as such.
LOOPBACK_NAMES: Final = frozenset({"localhost"})


def read_keys(path: str | None) -> frozenset[str] | None:
    """The client API keys of ``gateway.api_keys_file``: one per line, blank lines and
    ``#`` comments skipped; None when no file is set (no key is checked)."""
    if path is None:
        return None
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read gateway.api_keys_file: {exc}") from None
    keys = frozenset(k.strip() for k in lines if k.strip() and not k.strip().startswith("#"))
    if not keys:
        raise ConfigError(f"gateway.api_keys_file {path} holds no key")
    return keys


def is_loopback(host: str) -> bool:
    """Whether listening on ``host`` (gateway.host) stays on this machine."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name or an interface's address: reachable from elsewhere


def host_name(header: str) -> str:
    """The name of a Host header, without its port (an IPv6 address without brackets)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0].rstrip(".") if header.count(":") <= 1 else header


def fingerprint(key: str) -> str:
    """What an episode keeps of the client key that started it (never the key)."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


class Access:
    """The gateway's client keys and the names it answers to."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.keys = read_keys(settings.api_keys_file)
        if self.keys is None and not settings.allow_without_keys and not is_loopback(settings.host):
            raise StartupError(
                f"gateway.host {settings.host} listens beyond loopback without client keys: "
                "anyone who reaches it samples under the upstream's key; set "
                "gateway.api_keys_file, or gateway.allow_without_keys=true on a trusted network",
                reason="gateway_without_keys",
            )
        public = urlsplit(settings.public_url).hostname if settings.public_url else None
        self.any_host = "*" in settings.allowed_hosts
        self.hosts = LOOPBACK_NAMES | {h.lower() for h in settings.allowed_hosts}
        self.hosts |= {public} if public else set()

    def host_allowed(self, header: str) -> bool:
        """Whether a request with this Host header is answered (any with client keys)."""
        name = host_name(header)
        if self.keys is not None or self.any_host or name in self.hosts:
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True

    def caller(self, token: str | None) -> str | None:
        """The fingerprint of the caller's client key (None with keys off); 401
        unless the Bearer ``token`` is one."""
        if self.keys is None:
            return None
        if token is None or token not in self.keys:
            raise GatewayRefusal(
                401,
                "unknown API key: with client keys on, send your client key as the API key "
                "(an episode id is none) and bind calls by the episode's base_url",
                reason="invalid_api_key",
            )
        return fingerprint(token)

    def check_owner(self, client: str, caller: str | None) -> None:
        """403 unless ``caller`` holds the key that started the episode of ``client``
        (with keys on; an episode started with keys off, or before episodes kept
        their client, has "")."""
        if self.keys is None or not client:
            return
        if caller is None or not hmac.compare_digest(client, caller):
            raise GatewayRefusal(
                403, "this episode was started with another API key", reason="wrong_api_key"
            )
