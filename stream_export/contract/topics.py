"""The topics another language writes and reads: their specs (``topics/*.toml``,
:class:`TopicSpec`), the names of the worker's own topics, and the JSON Schemas of
the topic values, generated from the contract's types.

The specs travel with the package (the wheel carries ``topics/`` as
``stream_export/_topics``); ``stream_export.kafka.topics`` declares the topics
from them on a broker.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final, Literal, get_args

import msgspec

from stream_export.contract.episode import Episode
from stream_export.contract.events import SCHEMA_VERSION, StepEvent
from stream_export.contract.weights import ControlRecord
from stream_export.errors import ConfigError

SpecRole = Literal["steps", "episodes", "dead_letters"]
#: The groups stage's topics have no spec of their own: named after worker.app_id
#: (topic_names), wanted only with groups.enabled, configured like episodes.
Role = SpecRole | Literal["groups_by_group", "groups", "scores"]


def topic_names(app_id: str) -> tuple[str, str]:
    """(the repartition topic, the closed-groups topic) of the app ``app_id``."""
    return f"{app_id}-groups-by-group", f"{app_id}-groups"


def scores_topic(app_id: str) -> str:
    """The scores output's topic (scores.enabled): scores after their episode."""
    return f"{app_id}-scores"


_PACKAGE: Final = Path(__file__).parents[1]
_PACKAGED: Final = _PACKAGE / "_topics"  # the wheel carries topics/ here
_SOURCE: Final = _PACKAGE.parent / "topics"


class TopicSpec(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One ``topics/*.toml`` file."""

    role: SpecRole
    #: The default name; the setting ``topics.<role>`` decides.
    name: str
    description: str
    partitions: int | Literal["setting"]
    replication_factor: int | Literal["setting"]
    #: The worker keeps Faust tables partitioned like this topic.
    copartitioned: bool = False
    key: str
    value: str
    #: JSON Schema of the value, relative to the spec folder.
    value_schema: str | None = None
    headers: dict[str, str] = {}
    config: dict[str, str] = {}


def spec_dir() -> Path:
    """The folder with the specs: packaged with the wheel, else the source tree's."""
    return _PACKAGED if _PACKAGED.is_dir() else _SOURCE


def load_specs(directory: Path | None = None) -> list[TopicSpec]:
    """Every spec in ``directory`` (default: ``spec_dir()``), one per role."""
    directory = directory or spec_dir()
    specs = []
    for path in sorted(directory.glob("*.toml")):
        try:
            specs.append(msgspec.toml.decode(path.read_bytes(), type=TopicSpec))
        except (OSError, msgspec.MsgspecError) as exc:
            raise ConfigError(f"bad topic spec {path}: {exc}") from None
    order = get_args(SpecRole)
    roles = sorted(s.role for s in specs)
    if roles != sorted(order):
        raise ConfigError(f"{directory} must hold one spec per topic role, found {roles}")
    return sorted(specs, key=lambda s: order.index(s.role))


SCHEMA_DIR: Final = "schemas"
_SCHEMAS: Final[dict[str, tuple[Any, str]]] = {
    f"step-event.v{SCHEMA_VERSION}.schema.json": (StepEvent, "stream-export step event"),
    f"episode.v{SCHEMA_VERSION}.schema.json": (Episode, "stream-export finished episode"),
    "weights-control.v1.schema.json": (ControlRecord, "stream-export weight-fence control record"),
}


def schema_documents() -> dict[str, str]:
    """File name -> JSON Schema text, generated from the contract's types."""
    documents = {}
    for filename, (type_, title) in _SCHEMAS.items():
        document = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": title,
            "$comment": "Generated from stream_export/contract/ by `stream-export topics "
            "schemas`; do not edit by hand.",
            **msgspec.json.schema(type_),
        }
        documents[filename] = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    return documents


def stale_schemas(directory: Path) -> list[str]:
    """Schema files in ``directory`` that are missing or differ from the code."""
    return [
        name
        for name, text in schema_documents().items()
        if not (directory / name).is_file() or (directory / name).read_text() != text
    ]


def write_schemas(directory: Path) -> list[str]:
    """Regenerate the schema files in ``directory``; return the names that changed."""
    stale = stale_schemas(directory)
    directory.mkdir(parents=True, exist_ok=True)
    documents = schema_documents()
    for name in stale:
        (directory / name).write_text(documents[name])
    return stale
