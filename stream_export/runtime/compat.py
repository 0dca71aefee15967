"""The private names of faust-streaming and aiokafka stream-export relies on, checked
before the worker starts.

Some of what the worker does has no public API in the versions pyproject.toml
bounds it to (see each entry's ``use``). An upgrade that removed or reshaped one
of these names would otherwise surface as an AttributeError deep inside the
running worker, or as a silent change of behaviour (upstream Faust has already
changed ``_maybe_set_key_ttl``). :func:`check` stops the worker first, with one
line naming the installed versions, the name and the versions it is tested with.
ruff's SLF rule flags any private access outside the modules that use these.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import re
from dataclasses import dataclass
from typing import Any, Final, Literal

from stream_export.errors import IncompatibleDependencyError

#: The distributions that own the names, as pip knows them.
PACKAGES: Final = ("faust-streaming", "aiokafka")


@dataclass(frozen=True)
class Name:
    """``owner.name``: a module attribute, a method (with the parameters after
    ``self`` that we pass or override), or an attribute ``owner.__init__`` sets."""

    owner: str
    name: str
    kind: Literal["attribute", "method", "init_attribute"]
    use: str
    params: tuple[str, ...] = ()

    def problem(self) -> str | None:
        """What is wrong with this name in the installed packages, or None."""
        try:
            owner = _resolve(self.owner)
        except (ImportError, AttributeError):
            return f"{self.owner} is missing"
        if self.kind == "init_attribute":
            init = getattr(owner, "__init__", None)
            code = getattr(init, "__code__", None)
            if code is None or self.name not in code.co_names:
                return f"{self.owner}.__init__ no longer sets {self.name}"
            return None
        found = getattr(owner, self.name, None)
        if found is None:
            return f"{self.owner}.{self.name} is missing"
        if self.kind == "method":
            params = [p for p in inspect.signature(found).parameters if p != "self"]
            if not callable(found) or params != list(self.params):
                return (
                    f"{self.owner}.{self.name} takes ({', '.join(params)}), "
                    f"not ({', '.join(self.params)})"
                )
        return None


_FAUST_KAFKA = "faust.transport.drivers.aiokafka"
_CONSUMER = "faust.transport.consumer.Consumer"
NAMES: Final = (
    Name("faust.streams", "_current_event", "attribute", "table stores name their partition"),
    Name(
        "faust.tables.base.Collection",
        "_maybe_set_key_ttl",
        "method",
        "open-table window expiry bookkeeping (patches.tables.WindowedTable)",
        ("key", "partition"),
    ),
    Name(
        "faust.tables.base.Collection",
        "_maybe_del_key_ttl",
        "method",
        "window expiry bookkeeping on deletes",
        ("key", "partition"),
    ),
    Name("faust.tables.base.Collection", "_partition_timestamp_keys", "init_attribute", "expiry"),
    Name("faust.tables.base.Collection", "_partition_timestamps", "init_attribute", "expiry"),
    Name(f"{_FAUST_KAFKA}.Producer", "_ensure_producer", "method", "record batches (Outbox)"),
    Name(f"{_FAUST_KAFKA}.Producer", "_settings_default", "method", "producer retry backoff"),
    Name(f"{_FAUST_KAFKA}.Consumer", "_new_consumer_thread", "method", "consumer thread class"),
    Name(
        f"{_FAUST_KAFKA}.Consumer",
        "_getmany",
        "method",
        "steps records handed over in batches (patches.consumer.Consumer)",
        ("active_partitions", "timeout"),
    ),
    Name("faust.stores.base.SerializedStore", "_iteritems", "method", "raw items at rebuild"),
    Name("faust.tables.TableManager", "_update_channels", "method", "tables started at once"),
    Name(_CONSUMER, "_new_offset", "method", "commit what the assembler acknowledged", ("tp",)),
    Name(
        _CONSUMER,
        "_filter_tps_with_pending_acks",
        "method",
        "commit the partitions the assembler acknowledged",
        ("topics",),
    ),
    Name(
        f"{_FAUST_KAFKA}.AIOKafkaConsumerThread",
        "_create_worker_consumer",
        "method",
        "consumer retry backoff",
        ("transport",),
    ),
    Name("mode.threads.ServiceThread", "_stopped_set", "method", "stop after the loop closed"),
    Name("mode.worker.Worker", "_gather_all", "method", "last tasks at stop"),
    Name("mode.worker.Worker", "_sentinel_task", "method", "last tasks unwound"),
    Name(
        f"{_FAUST_KAFKA}.AIOKafkaConsumerThread",
        "_commit",
        "method",
        "bounded commits during an outage",
        ("offsets",),
    ),
    Name("aiokafka.AIOKafkaConsumer", "_retry_backoff_ms", "init_attribute", "retry backoff"),
    Name("aiokafka.AIOKafkaConsumer", "_client", "init_attribute", "retry backoff"),
    Name("aiokafka.AIOKafkaConsumer", "_fetch_max_wait_ms", "init_attribute", "fetch wait"),
    Name("aiokafka.client.AIOKafkaClient", "_retry_backoff", "init_attribute", "retry backoff"),
    Name(
        "aiokafka.client.AIOKafkaClient",
        "_metadata_update",
        "method",
        "metadata refreshes paced during an outage",
        ("cluster_metadata", "topics"),
    ),
    Name("aiokafka.AIOKafkaProducer", "_closed", "init_attribute", "client: abandon on outage"),
    Name("aiokafka.AIOKafkaProducer", "_sender", "init_attribute", "client: abandon on outage"),
    Name(
        "aiokafka.AIOKafkaProducer",
        "_message_accumulator",
        "init_attribute",
        "client: fail what an abandoned producer still holds",
    ),
)


def check(names: tuple[Name, ...] = NAMES) -> None:
    """Raise IncompatibleDependencyError unless every name is as stream-export expects."""
    problems = [p for p in (n.problem() for n in names) if p is not None]
    if not problems:
        return
    installed = ", ".join(f"{p} {_version(p)}" for p in PACKAGES)
    raise IncompatibleDependencyError(
        f"installed {installed}, but {problems[0]}"
        + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
        + f"; stream-export is tested with {tested()}: install those (dev/setup installs "
        "the locked versions)"
    )


def tested() -> str:
    """The bounds stream-export declares for PACKAGES, from its installed metadata."""
    wanted = []
    for requirement in importlib.metadata.requires("stream-export") or []:
        match = re.match(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*(.*)", requirement)
        if match and match[1] in PACKAGES and "extra ==" not in requirement:
            wanted.append(f"{match[1]}{match[3].split(';')[0].strip()}")
    return ", ".join(wanted) or "the versions in uv.lock"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def _resolve(path: str) -> Any:
    """A module, or an attribute path inside one: 'package.module.Class'."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(path)
