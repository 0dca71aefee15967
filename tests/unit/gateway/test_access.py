"""Who may use the gateway and from where, what one request may hold, and the
quotas: the pure rules behind tests/integration/gateway/test_edge.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge

from stream_export.errors import GatewayRefusal, GatewayRequestError, StartupError
from stream_export.gateway.access import Access, fingerprint, host_name, is_loopback
from stream_export.gateway.edge import InFlight
from stream_export.gateway.quota import CallRate, capped
from stream_export.settings.gateway import GatewaySettings


def access(tmp_path: Path, keys: str | None = None, **settings: Any) -> Access:
    if keys is not None:
        (tmp_path / "keys").write_text(keys)
        settings["api_keys_file"] = str(tmp_path / "keys")
    return Access(GatewaySettings(**settings))


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.5", False),
        ("gateway.internal", False),
    ],
)
def test_what_stays_on_this_machine(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_a_keyless_gateway_listens_beyond_loopback_only_when_told(tmp_path: Path) -> None:
    with pytest.raises(StartupError) as refused:
        access(tmp_path, host="0.0.0.0")
    assert refused.value.reason == "gateway_without_keys"
    assert "gateway.allow_without_keys" in refused.value.detail
    assert access(tmp_path, host="0.0.0.0", allow_without_keys=True).keys is None
    assert access(tmp_path, "k1\n", host="0.0.0.0").keys == frozenset({"k1"})
    assert access(tmp_path, host="127.0.0.1").keys is None


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("Evil.Example:9180", "evil.example"),
        ("evil.example", "evil.example"),
        ("localhost.:80", "localhost"),
        ("[::1]:9180", "::1"),
        ("[::1]", "::1"),
        ("127.0.0.1:9180", "127.0.0.1"),
    ],
)
def test_a_host_header_names_its_host_without_the_port(header: str, name: str) -> None:
    assert host_name(header) == name


@given(st.text(max_size=80))
def test_any_host_header_is_judged_without_an_error(header: str) -> None:
    checker = Access(GatewaySettings(public_url="https://gw.example.com/v1"))
    assert checker.host_allowed(header) in (True, False)


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        ("127.0.0.1:9180", True),
        ("10.1.2.3:9180", True),  # an address: no name to rebind
        ("[::1]:9180", True),
        ("localhost:9180", True),
        ("gw.example.com", True),  # public_url's host
        ("svc.ns.svc", True),  # allowed_hosts
        ("evil.example:9180", False),
        ("gw.example.com.evil.example", False),
        ("", False),
    ],
)
def test_the_host_must_be_an_address_localhost_or_a_name_of_the_gateway(
    header: str, allowed: bool
) -> None:
    checker = Access(
        GatewaySettings(public_url="https://gw.example.com/v1", allowed_hosts=["svc.ns.svc"])
    )
    assert checker.host_allowed(header) is allowed
    assert Access(GatewaySettings(allowed_hosts=["*"])).host_allowed(header)


def test_with_client_keys_any_host_is_answered(tmp_path: Path) -> None:
    """A rebinding page cannot send a key it does not hold; the chart's Service names
    and an Ingress's need no list then."""
    assert access(tmp_path, "k1\n").host_allowed("svc.ns.svc.cluster.local:9180")


def test_with_keys_on_only_a_client_key_is_a_caller_and_only_the_starter_owns(
    tmp_path: Path,
) -> None:
    keyed = access(tmp_path, "# team keys\nteam-a\n\nteam-b\n")
    a, b = keyed.caller("team-a"), keyed.caller("team-b")
    assert a == fingerprint("team-a") != b and "team-a" not in str(a)
    for token in (None, "", "ep-" + "A" * 43, "team-c"):
        with pytest.raises(GatewayRefusal) as unknown:
            keyed.caller(token)
        assert (unknown.value.status, unknown.value.reason) == (401, "invalid_api_key")
    keyed.check_owner(a, a)
    keyed.check_owner("", b)  # an episode from before episodes kept their client
    with pytest.raises(GatewayRefusal) as other:
        keyed.check_owner(a, b)
    assert (other.value.status, other.value.reason) == (403, "wrong_api_key")
    keyless = access(tmp_path)
    assert keyless.caller(None) is None and keyless.caller("anything") is None
    keyless.check_owner(a, None)  # keys turned off: the episode id is the capability


def test_bytes_in_flight_are_bounded_but_a_request_alone_always_goes() -> None:
    gauge = Gauge("in_flight", "", registry=CollectorRegistry())
    held = InFlight(100, gauge)
    assert held.take(60) and held.take(40)
    assert not held.take(1)
    held.give(60)
    assert held.take(50) and not held.take(20)
    held.give(40)
    held.give(50)
    assert held.bytes == 0 and held.take(1000)  # alone, larger than the bound
    assert gauge._value.get() == 1000  # noqa: SLF001 (the gauge shows what is held)


@pytest.mark.parametrize(
    ("body", "sent"),
    [
        ({"messages": []}, {"messages": [], "max_tokens": 8}),
        ({"max_tokens": 8}, {"max_tokens": 8}),
        ({"max_completion_tokens": 3}, {"max_completion_tokens": 3}),
        ({"max_tokens": None}, {"max_tokens": 8}),
    ],
)
def test_a_max_tokens_cap_fills_in_what_a_call_leaves_open(
    body: dict[str, Any], sent: dict[str, Any]
) -> None:
    assert capped(body, 8) == sent
    assert capped(body, None) is body


@pytest.mark.parametrize(
    "body",
    [
        {"max_tokens": 9},
        {"max_completion_tokens": 9},
        {"max_tokens": 2, "max_completion_tokens": 9},
        {"max_tokens": "4"},
        {"max_tokens": 4.0},
        {"max_tokens": True},
    ],
)
def test_a_call_over_the_cap_is_refused(body: dict[str, Any]) -> None:
    with pytest.raises(GatewayRequestError) as over:
        capped(body, 8)
    assert over.value.reason == "max_tokens_too_large"


def test_calls_a_minute_are_a_bucket_per_key_refilled_evenly() -> None:
    now = [0.0]
    rate = CallRate(3, clock=lambda: now[0])
    assert [rate.wait_s("a") for _ in range(3)] == [0, 0, 0]
    assert rate.wait_s("a") == 20  # one call every 20 s
    assert rate.wait_s("b") == 0  # another key, its own budget
    now[0] = 19.5
    assert rate.wait_s("a") == 1
    now[0] = 20.0
    assert rate.wait_s("a") == 0 and rate.wait_s("a") == 20
    now[0] = 1000.0  # a long pause saves up a minute's calls, no more
    assert [rate.wait_s("a") for _ in range(4)] == [0, 0, 0, 20]
