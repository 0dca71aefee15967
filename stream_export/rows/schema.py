"""The column types of every built-in output, as Arrow schemas (from the columns
declared in :mod:`.columns`): pure, no I/O.

A JSON file carries no types, so a reader infers them, file by file: a column null
throughout one file (no reward, no tool call) gets none, and files of the same
output then disagree. These schemas are what the rows are; ``card`` declares them
for Hugging Face ``datasets``. A schema holds every column an output can write:
a row without one of them (a text rollout's token columns, a message without
``tool_calls``) reads as null there.

Outputs without one (None): the ``episode`` format and custom formatters (the
agents' free-form JSON), and metadata keys of the agents' own, which keep the type
each agent sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stream_export.contract import widths
from stream_export.rows import formats
from stream_export.rows.columns import FORMATS, GROUP_OUTPUTS, METADATA, SCORE, SCORE_ROWS
from stream_export.settings.format import FormatSettings

if TYPE_CHECKING:
    import pyarrow as pa


def _types() -> dict[str, Any]:
    import pyarrow as pa  # imported on use: the worker's hot path never needs it

    text = pa.string()
    call = pa.struct(
        [
            ("id", text),
            ("type", text),
            ("function", pa.struct([("name", text), ("arguments", text)])),
        ]
    )
    message = pa.struct(
        [
            ("role", text),
            ("content", text),
            ("name", text),
            ("tool_calls", pa.list_(call)),
            ("tool_call_id", text),
        ]
    )
    # The numeric types are the contract's widths: what its decoders let through.
    integer, number = pa.type_for_alias(widths.INTEGER_TYPE), pa.type_for_alias(widths.FLOAT_TYPE)
    scalars = {
        "text": text,
        "int": integer,
        "float": number,
        "evaluator": pa.struct([("id", text), ("version", text)]),
    }
    return {
        **scalars,
        "bool": pa.bool_(),
        "texts": pa.list_(text),
        "ints": pa.list_(integer),
        "floats": pa.list_(number),
        "messages": pa.list_(message),
        "ids": pa.list_(pa.type_for_alias(widths.TOKEN_ID_TYPE)),
        "mask": pa.list_(pa.int8()),
        "logprobs": pa.list_(pa.type_for_alias(widths.LOGPROB_TYPE)),
        "rewards": pa.list_(pa.struct([("name", text), ("value", number)])),
        "scores": pa.list_(pa.struct([(name, scalars[kind]) for name, kind in SCORE])),
    }


def _schema(columns: tuple[tuple[str, str], ...] | list[tuple[str, str]]) -> pa.Schema:
    import pyarrow as pa

    types = _types()
    return pa.schema([(name, types[kind]) for name, kind in columns])


def episode_schema(settings: FormatSettings) -> pa.Schema | None:
    """The schema of the sink's records in ``settings``' format, metadata included
    (None: the format has none, see the module doc)."""
    own = FORMATS.get(settings.format)
    if own is None:
        return None
    names = formats.metadata_names(settings)
    if any(name not in METADATA for name in names):
        return None
    fields = [(name, METADATA[name]) for name in names]
    if settings.metadata_mode != "nested":
        return _schema([*own, *fields])
    import pyarrow as pa

    return _schema(own).append(pa.field("metadata", pa.struct(_schema(fields))))


def score_schema() -> pa.Schema:
    """The schema of the scores output."""
    return _schema(SCORE_ROWS)


def group_schema(output: str) -> pa.Schema:
    """The schema of one of the groups stage's outputs."""
    return _schema(GROUP_OUTPUTS[output])


def verl_schema() -> Any:
    """The pyarrow schema of verl rows (``rows.groups.verl_row``)."""
    import pyarrow as pa

    text = pa.string()
    return pa.schema(
        [
            ("data_source", text),
            ("prompt", pa.list_(pa.struct([("role", text), ("content", text)]))),
            ("ability", text),
            ("reward_model", pa.struct([("style", text), ("ground_truth", text)])),
            (
                "extra_info",
                pa.struct(
                    [
                        ("index", pa.int64()),
                        ("group_id", text),
                        ("pass_rate", pa.float64()),
                        ("mean_reward", pa.float64()),
                        ("scored", pa.int64()),
                        ("completions", pa.list_(text)),
                        ("rewards", pa.list_(pa.float64())),
                    ]
                ),
            ),
        ]
    )
