"""The scores output: one JSON line per score that arrived after its episode was
published (files ``<sink.prefix>.scores``, from the topic ``<worker.app_id>-scores``),
deduplicated by episode and score id. Join it to the episode output on
``record_id`` (the episode's ``episode_id``)."""

from __future__ import annotations

from typing import Final

import faust
import msgspec

from stream_export.contract.decoding import decode_as
from stream_export.contract.scores import ScoreRow, row_key
from stream_export.contract.topics import scores_topic
from stream_export.output import sink
from stream_export.output.sink import Read
from stream_export.rows import formats, schema
from stream_export.runtime.app import Topics
from stream_export.runtime.metrics import Metrics
from stream_export.settings import Settings

_decoder: Final = msgspec.json.Decoder(ScoreRow)


def decode_row(value: bytes | None) -> ScoreRow:
    return decode_as(_decoder, value, "score row")


def read(value: bytes | None) -> Read:
    """One row of the scores topic as its line; its id is its key's."""
    row = decode_row(value)
    line = formats.encode(msgspec.to_builtins(row))
    return Read(row_key(row.episode_id, row.score_id).decode(), [line], row.time)


def attach(app: faust.App, topics: Topics, settings: Settings, metrics: Metrics) -> None:
    """Run the scores output's sink in the worker (with scores.enabled)."""
    files = msgspec.structs.replace(settings.sink, prefix=f"{settings.sink.prefix}.scores")
    topic = scores_topic(settings.worker.app_id)
    output = sink.Output("scores-sink", topic, files, read, schema.score_schema)
    sink.attach(app, topics, settings, metrics, output)
