"""Fields an upstream refuses: the gateway asks for token ids and logprobs
(``return_token_ids``, ``logprobs``), which a hosted API that checks its request
fields (OpenAI's does) answers with a 400 naming the field. Such a call is sent
once more at once without the added fields (recorded text-only), and the upstream
is remembered as refusing them, so its later calls go without them and pay no
second round trip. A 400 naming a field the client sent itself is passed on.
Pure, no I/O.
"""

from __future__ import annotations

from typing import Any, Final

from stream_export.gateway import wire
from stream_export.gateway.upstream import Failure

#: The statuses an upstream refuses a request's fields with (OpenAI: 400; FastAPI: 422).
STATUSES: Final = frozenset({400, 422})


def added(sent: dict[str, Any], plain: dict[str, Any]) -> list[str]:
    """The fields ``sent`` has that the client's request (``plain``) has not, or has
    with another value: what the gateway added."""
    return [k for k, v in sent.items() if k not in plain or plain[k] != v]


def refused_field(failure: Failure, fields: list[str]) -> str | None:
    """The first of ``fields`` the upstream's error names (its message, its ``param``,
    or a FastAPI validation error's ``loc``), if it is a refusal."""
    if failure.status not in STATUSES or not fields:
        return None
    try:
        body = wire.decode(failure.body)
    except ValueError:
        text = failure.body[:4096].decode(errors="replace")
    else:
        text = wire.encode(body).decode()
    return next((f for f in fields if f in text), None)
