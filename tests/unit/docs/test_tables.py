"""The docs' dead-letter reasons and metrics tables name exactly what the code has
(every DeadLetterReason, every metric family of the worker and the gateway with its
type and labels, nothing else), and metric names spelled out in the package exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from prometheus_client import Info
from prometheus_client.metrics import MetricWrapperBase

import stream_export
from stream_export.contract.reasons import DeadLetterReason
from stream_export.feed.metrics import FeedMetrics
from stream_export.gateway.metrics import GatewayMetrics
from stream_export.runtime.metrics import Metrics

REFERENCE = Path(__file__).resolve().parents[3] / "docs" / "reference"


def page(name: str) -> str:
    """The text of a reference page."""
    return (REFERENCE / name).read_text()


def table(text: str) -> list[list[str]]:
    """The cells of the first table in ``text``, without its header and rule rows."""
    rows: list[list[str]] = []
    for line in text[text.index("\n|") + 1 :].splitlines():
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows[2:]


def test_the_bad_input_table_lists_every_dead_letter_reason() -> None:
    documented = [row[0].strip("`") for row in table(page("dead-letters.md"))]
    assert len(documented) == len(set(documented)), "a reason is listed twice"
    assert set(documented) == set(DeadLetterReason)


def registered() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Every stream_export metric, as the docs name it (a counter with ``_total``,
    an info with ``_info``): its type and label names."""
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    every = (Metrics(), GatewayMetrics(), FeedMetrics())
    for metric in [value for m in every for value in vars(m).values()]:
        if not isinstance(metric, MetricWrapperBase):
            continue
        (family,) = metric.describe()
        suffix = {"counter": "_total", "info": "_info"}.get(family.type, "")
        if isinstance(metric, Info):
            ((sample,),) = (collected.samples for collected in metric.collect())
            labels = tuple(sample.labels)
        else:
            labels = metric._labelnames  # noqa: SLF001 (prometheus-client has no public getter)
        found[family.name + suffix] = (family.type, labels)
    return found


def documented() -> dict[str, tuple[str, tuple[str, ...]]]:
    found: dict[str, tuple[str, tuple[str, ...]]] = {}
    for name_and_labels, kind, _ in table(page("metrics.md")):
        matched = re.fullmatch(r"`(\w+)(?:\{([\w,]+)\})?`", name_and_labels)
        assert matched, name_and_labels
        name, labels = matched.group(1), matched.group(2)
        assert name not in found, f"{name} is listed twice"
        found[name] = (kind, tuple(labels.split(",")) if labels else ())
    return found


def test_the_metrics_table_lists_every_family_with_its_type_and_labels() -> None:
    code, readme = registered(), documented()
    assert set(code) - set(readme) == set(), "families missing from the docs' table"
    assert set(readme) - set(code) == set(), "the docs' table names families that do not exist"
    assert readme == code


def test_the_code_names_only_metrics_that_exist() -> None:
    """Metric names are defined once, in metrics.py; a full name spelled out elsewhere
    (status.py, http.py read samples by name) is one of the registry's families or
    samples, or a stem of whole words they build names on."""
    registries = (Metrics().registry, GatewayMetrics().registry)
    samples = {s.name for r in registries for family in r.collect() for s in family.samples}
    known = samples | set(registered()) | {name.removesuffix("_total") for name in registered()}
    package = Path(stream_export.__file__).parent
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
                continue
            name = node.value
            if re.fullmatch(r"stream_export_\w+", name) and path.name != "metrics.py":
                stem = any(k.startswith(name.rstrip("_") + "_") for k in known)
                assert name in known or stem, f"{path.name}: {name} is no metric"
