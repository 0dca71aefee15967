"""Which refusal names a field the gateway added (stream_export.gateway.refused)."""

from __future__ import annotations

import json

from stream_export.gateway.mapping import upstream_request
from stream_export.gateway.refused import added, refused_field
from stream_export.gateway.upstream import Failure
from tests.support.daydreams_upstream import unknown_fields_error


def failure(status: int, body: object) -> Failure:
    return Failure(status, json.dumps(body).encode(), "application/json")


def test_openais_400_names_the_added_field_and_a_clients_own_field_is_passed_on() -> None:
    client = {"messages": [], "model": "m", "logprobs": False}
    sent, _ = upstream_request("chat", client)
    fields = added(sent, client)
    assert sorted(fields) == ["logprobs", "return_token_ids"]
    refusal = failure(400, unknown_fields_error(["return_token_ids"]))
    assert refused_field(refusal, fields) == "return_token_ids"
    own = failure(400, unknown_fields_error(["top_k"]))  # the client's own field
    assert refused_field(own, fields) is None
    assert refused_field(failure(500, unknown_fields_error(["logprobs"])), fields) is None
    fastapi = failure(422, {"detail": [{"loc": ["body", "logprobs"], "msg": "extra"}]})
    assert refused_field(fastapi, fields) == "logprobs"
    assert refused_field(Failure(400, b"logprobs not allowed", "text/plain"), fields) == "logprobs"


def test_a_field_the_client_asked_for_itself_is_not_the_gateways() -> None:
    client = {"messages": [], "logprobs": True, "return_token_ids": True}
    sent, _ = upstream_request("chat", client)
    assert added(sent, client) == []
