"""The settings parts of the chart's values.schema.json, generated from stream_export.settings,
so a misspelled or out-of-range setting in the values fails ``helm template`` / ``helm
install`` with the key's name instead of being ignored or failing in the pod.

``python -m tests.support.helm_schema`` rewrites the schema after a setting changes;
tests/unit/test_helm_settings.py fails while the checked-in schema differs from this.
"""

from __future__ import annotations

import json
import typing
from typing import Any, Literal

import msgspec

from stream_export import settings
from stream_export.settings import values
from stream_export.settings.values import env_name
from tests.support.monitoring import CHART

SCHEMA = CHART / "values.schema.json"

#: Settings the chart never passes on, and why; everything else the chart does not
#: set from its own values is allowed under ``settings``.
NEVER = {
    "kafka.sasl_password": "a password never goes into the pod spec: kafka.sasl.existingSecret",
    "worker.worker_id": "the pod name, unique and stable per StatefulSet pod",
}
#: Chart values that become a setting, so their schema carries the setting's bounds.
VALUES = {
    ("kafka", "bootstrapServers"): "kafka.bootstrap_servers",
    ("kafka", "securityProtocol"): "kafka.security_protocol",
    ("topics", "steps"): "topics.steps",
    ("topics", "episodes"): "topics.episodes",
    ("topics", "deadLetters"): "topics.dead_letters",
    ("topics", "partitions"): "topics.partitions",
    ("topics", "replicationFactor"): "topics.replication_factor",
    ("worker", "appId"): "worker.app_id",
    ("worker", "logLevel"): "worker.log_level",
    ("worker", "logJson"): "worker.log_json",
    ("http", "port"): "http.port",
    ("http", "probePort"): "http.probe_port",
    ("gateway", "port"): "gateway.port",
    ("gateway", "publicUrl"): "gateway.public_url",
}
#: The templates that set settings: the worker's, the gateway's and their shared parts.
SETTING_TEMPLATES = ("statefulset.yaml", "gateway.yaml", "_helpers.tpl")


def chart_sets(key: str) -> bool:
    """Whether the chart's templates set this setting themselves (from other values)."""
    templates = "".join((CHART / "templates" / name).read_text() for name in SETTING_TEMPLATES)
    return f"- name: {env_name(*key.split('.'))}\n" in templates


def _number_pattern(bare: Any, negative: bool) -> str:
    sign = "[-+]?" if negative else r"\+?"
    if bare is int:
        return f"{sign}[0-9]+"
    return rf"{sign}([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?"


def field_schema(annotation: Any) -> dict[str, Any]:
    """The schema of one setting as a chart value: the template turns every value into
    a string, so numbers and booleans may also be written as strings."""
    bare, optional, meta = values.unwrap(annotation)
    node: dict[str, Any] = {}
    if typing.get_origin(bare) is Literal:
        node["enum"] = [*typing.get_args(bare), *([""] if optional else [])]
    elif bare is bool:
        node["enum"] = [True, False, "true", "false"]
    elif bare in (int, float):
        node.update(msgspec.json.schema(typing.Annotated[bare, meta]))
        node["type"] = [node["type"], "string"]
        low = meta.ge if meta.ge is not None else meta.gt
        pattern = _number_pattern(bare, low is None or low < 0)
        node["pattern"] = f"^({pattern})?$" if optional else f"^{pattern}$"
    else:
        node["type"] = "string"
        if not optional and bare is str:
            node.update(msgspec.json.schema(typing.Annotated[bare, meta]))
    node["description"] = values.allowed(annotation)
    return node


def settings_schema() -> dict[str, Any]:
    """The ``settings`` value: section -> field -> value, each field with its bounds."""
    sections: dict[str, Any] = {}
    for key, annotation in settings.field_types().items():
        section, _, field = key.partition(".")
        node = sections.setdefault(
            section, {"type": "object", "properties": {}, "additionalProperties": False}
        )
        if key not in NEVER and not chart_sets(key):
            node["properties"][field] = field_schema(annotation)
    return {
        "type": "object",
        "description": "section -> field -> value; each becomes STREAM_EXPORT_<SECTION>_<FIELD>. "
        "Settings the chart sets from its own values are not allowed here.",
        "properties": {s: node for s, node in sections.items() if node["properties"]},
        "additionalProperties": False,
    }


def generated() -> dict[str, Any]:
    """The whole values schema with its settings parts regenerated."""
    schema: dict[str, Any] = json.loads(SCHEMA.read_text())
    properties = schema["properties"]
    properties["settings"] = settings_schema()
    types = settings.field_types()
    for (group, name), key in VALUES.items():
        properties[group]["properties"][name] = field_schema(types[key])
    return schema


def main() -> None:
    SCHEMA.write_text(json.dumps(generated(), indent=2) + "\n")


if __name__ == "__main__":
    main()
