"""What a setting's value may be, and how values are read and checked.

The value types (:class:`Secret`, bounded strings), what each accepts in words
(the "must be ..." of its error, also used by ``config list`` and the Helm
schema), and the raw values of a TOML file, the environment and ``--set`` flags,
each converted to its type or refused with a one-line ConfigError. The settings
structs that use them, and ``load``, are in :mod:`stream_export.settings`.
"""

from __future__ import annotations

import difflib
import json
import os
import tomllib
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from stream_export.contract.widths import FLOAT64_MAX
from stream_export.errors import ConfigError

ENV_PREFIX = "STREAM_EXPORT_"
#: The one environment variable with the prefix that is not a setting.
CONFIG_ENV: Final = f"{ENV_PREFIX}CONFIG"

#: The units the sections' bounds are written in.
DAY: Final = 86_400.0
YEAR: Final = 365 * DAY
GIB: Final = 1 << 30


class Secret:
    """A secret string: repr, str, format, logs and dumps show ``***``; ``reveal()``
    gives the text. Not a ``str`` subclass, so the clear text cannot leak through
    str(), f-strings or concatenation by accident."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def __repr__(self) -> str:
        return "Secret('***')"

    def __str__(self) -> str:
        return "***"

    def __format__(self, spec: str) -> str:
        return "***"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def reveal(self) -> str:
        return self._value


# Constrained string types; each description is the "must be ..." of its error.
NonEmpty = Annotated[str, Meta(min_length=1, max_length=4096, description="a non-empty string")]
#: File-name parts (worker ids, file prefixes, partition folders): the sink builds
#: file names from them, so no such part can name a path outside its folder.
SAFE_NAME: Final = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
SafeName = Annotated[
    str,
    Meta(
        pattern=SAFE_NAME,
        description="1-128 letters, digits, '.', '_' or '-', starting with a letter or digit",
    ),
]
#: Kafka's topic-name rule (a leading '.' is refused too: it reads as a hidden file).
TopicName = Annotated[
    str,
    Meta(
        pattern=r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,248}$",
        description="a topic name: 1-249 letters, digits, '.', '_' or '-', not starting with '.'",
    ),
]
_HOST = r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:[0-9]{1,5})?"
Bootstrap = Annotated[
    str,
    Meta(
        pattern=rf"^ *{_HOST} *(, *{_HOST} *)*$",
        description="a comma-separated list of host:port (port from 1 to 65535)",
    ),
]
Finite = Annotated[float, Meta(ge=-FLOAT64_MAX, le=FLOAT64_MAX, description="a finite number")]


def env_name(section: str, field: str) -> str:
    return f"{ENV_PREFIX}{section}_{field}".upper()


def _optional(annotation: Any) -> tuple[Any, bool]:
    """(the type without ``| None``, whether None is allowed)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(annotation))
    return annotation, False


def unwrap(annotation: Any) -> tuple[Any, bool, Meta]:
    """(the bare type, whether None is allowed, its Meta constraints or an empty Meta)."""
    bare, optional = _optional(annotation)
    meta = Meta()
    if typing.get_origin(bare) is Annotated:
        bare, *extra = typing.get_args(bare)
        meta = next(m for m in extra if isinstance(m, Meta))
    return bare, optional, meta


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def allowed(annotation: Any) -> str:
    """What a setting of this type accepts, in words: the "must be ..." of its error."""
    bare, optional, meta = unwrap(annotation)
    origin = typing.get_origin(bare)
    if meta.description:
        text = meta.description
    elif origin is Literal:
        text = "one of " + ", ".join(str(v) for v in typing.get_args(bare))
    elif origin is list:
        text = f"a comma-separated list, each {allowed(typing.get_args(bare)[0])}"
    elif bare is bool:
        text = "true or false"
    elif bare in (int, float):
        text = "an integer" if bare is int else "a number"
        if meta.ge is not None and meta.le is not None:
            text += f" from {_number(meta.ge)} to {_number(meta.le)}"
        else:
            low = f">= {_number(meta.ge)}" if meta.ge is not None else None
            if meta.gt is not None:
                low = f"> {_number(meta.gt)}"
            high = f"<= {_number(meta.le)}" if meta.le is not None else None
            text += " " + " and ".join(p for p in (low, high) if p)
    elif meta.max_length is not None:
        text = f"a string of {meta.min_length or 0} to {meta.max_length} characters"
    else:
        text = "a string"
    return f"{text}, or empty for none" if optional else text


def _dec_hook(kind: type, obj: Any) -> Any:
    if kind is Secret and isinstance(obj, str):
        return Secret(obj)
    raise TypeError("expected a string")


def _coerce(value: Any, annotation: Any) -> Any:
    """Env, flag and Helm values are strings: "" is None where allowed, lists are
    comma-separated."""
    if not isinstance(value, str):
        return value
    bare, optional, _ = unwrap(annotation)
    if value == "" and optional:
        return None
    if typing.get_origin(bare) is list:
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _show(value: Any, annotation: Any) -> str:
    """A value for an error message: one line, short, and never a secret."""
    if unwrap(annotation)[0] is Secret:
        return "***"
    text = value if isinstance(value, str) else msgspec.json.encode(value).decode()
    if len(text) > 80:
        text = text[:77] + "..."
    return text if text and text.isprintable() and " " not in text else json.dumps(text)


def did_you_mean(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {close[0]}?" if close else ""


def convert(key: str, annotation: Any, value: Any, source: str) -> Any:
    """``value`` (from ``source``) as the type of setting ``key``, or ConfigError."""
    try:
        return msgspec.convert(
            _coerce(value, annotation), annotation, strict=False, dec_hook=_dec_hook
        )
    except msgspec.ValidationError:
        raise ConfigError(
            f"invalid setting {key}={_show(value, annotation)}: must be {allowed(annotation)} "
            f"(from {source})"
        ) from None


def _read_file(file: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        with open(file, "rb") as fh:
            return tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config file {file}: {exc}") from None


def read_sources(
    keys: Iterable[str],
    file: str | os.PathLike[str] | None,
    env: Mapping[str, str],
    overrides: Iterable[str],
) -> dict[str, tuple[Any, str]]:
    """``section.field`` -> (value, where it came from), the last source winning;
    ``keys`` are the settings' names (for their environment variables)."""
    raw: dict[str, tuple[Any, str]] = {}
    file = file or env.get(CONFIG_ENV)
    if file:
        for section, values in _read_file(file).items():
            if not isinstance(values, dict):
                raise ConfigError(
                    f"invalid setting {section} in {file}: must be a [{section}] table"
                )
            for field, value in values.items():
                raw[f"{section}.{field}"] = (value, str(file))
    by_env = {env_name(*key.split(".")): key for key in keys}
    for name in sorted(n for n in env if n.startswith(ENV_PREFIX) and n != CONFIG_ENV):
        if name not in by_env:
            raise ConfigError(
                f"unknown setting {name} (environment){did_you_mean(name, [*by_env, CONFIG_ENV])}"
            )
        raw[by_env[name]] = (env[name], name)
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects section.field=value, got {item!r}")
        raw[key.strip()] = (value, "--set")
    return raw
