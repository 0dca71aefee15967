"""The benchmarks' one report module (bench/report.py), and the reports of the
benchmarks that have no test file of their own (gateway_state, parquet, upload)."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest

from bench import gateway_state, parquet, upload
from bench.report import (
    RESULTS,
    Bar,
    Heading,
    Results,
    Spread,
    bar_table,
    cells,
    heading,
    num,
    page,
    per_round,
    percentile,
    results_json,
    round_ratios,
    title,
)

NOW = datetime(2026, 12, 7, 9, 5, tzinfo=UTC)


def test_percentile_interpolates_between_ranks() -> None:
    values = [float(v) for v in range(100, 0, -1)]  # 100 .. 1, unsorted on purpose
    assert percentile(values, 0) == 1
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 90) == pytest.approx(90.1)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile(values, 100) == 100
    assert percentile([3.0], 99) == 3.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_ratios_are_taken_within_a_round_only() -> None:
    figures = {("a", 1): 10.0, ("b", 1): 5.0, ("a", 2): 9.0, ("b", 2): 3.0, ("a", 3): 8.0}
    figures |= {("c", 3): 4.0, ("b", 4): 1.0}
    assert per_round(figures, "a", "b") == {1: 2.0, 2: 3.0}  # round 3 has no b, 4 no a
    assert round_ratios(figures, "a", ["c", "a", "b", "d"]) == {
        "a / c": Spread(2.0, 2.0, 2.0),
        "a / b": Spread(2.0, 2.5, 3.0),
    }


@pytest.mark.parametrize(
    ("op", "median", "said"),
    [
        (">=", 4.0, "met (and the stretch)"),
        (">=", 2.0, "met (stretch not)"),
        (">=", 0.5, "missed"),
        ("<=", 0.2, "met (and the stretch)"),
        ("<=", 0.9, "met (stretch not)"),
        ("<=", 1.5, "missed"),
    ],
)
def test_a_bar_says_its_verdict_and_the_stretchs(op: str, median: float, said: str) -> None:
    target, stretch = (1.0, 3.0) if op == ">=" else (1.0, 0.3)
    bar = Bar(name="x", op=op, target=target, stretch=stretch, value=Spread(0, median, 9))
    assert bar.said == said
    assert bar.verdict == said.split()[0]  # the results file's verdict: the target's
    unmeasured = msgspec.structs.replace(bar, value=None)
    assert unmeasured.said == unmeasured.verdict == "not measured"
    assert msgspec.structs.replace(bar, stretch=None).said == bar.verdict


def test_the_bar_table_and_the_results_json_give_target_stretch_value_verdict() -> None:
    bars = [
        Bar(name="a / b", op=">=", target=0.15, stretch=0.3, value=Spread(0.1, 0.2, 0.25)),
        Bar(name="p99, s", op="<=", target=1, value=None),
    ]
    assert bar_table(12, bars) == [
        "| bar (issue 12) | target | this run (min / median / max) | verdict |",
        "| --- | --- | --- | --- |",
        "| a / b | >= 0.150 (0.300) | 0.100 / 0.200 / 0.250 | met (stretch not) |",
        "| p99, s | <= 1.00 | - | not measured |",
    ]
    head = Heading(**heading("python -m bench.x", ["--rounds", "2"], NOW))
    data = msgspec.json.decode(results_json(head, bars))
    assert (
        data["date"] == "2026-12-07 09:05 UTC" and data["command"] == "python -m bench.x --rounds 2"
    )
    assert data["broker"] is None and " cores, " in data["machine"]
    assert data["bars"][0] == {
        "name": "a / b",
        "target": ">= 0.15",
        "stretch": 0.3,
        "value": {"min": 0.1, "median": 0.2, "max": 0.25},
        "verdict": "met",
    }


def test_a_page_starts_with_title_command_machine_broker_and_ends_with_its_notes() -> None:
    head = Heading(date="D", command="python -m bench.x", machine="2 cores", broker="given, b:1")
    lines = [*title("X benchmark", head, "one client"), "", "body"]
    assert page(lines, ["a", "b"]).splitlines() == [
        "# X benchmark, D",
        "",
        "`python -m bench.x` on 2 cores; broker: given, b:1; one client.",
        "",
        "body",
        "",
        "Note: a",
        "",
        "Note: b",
    ]
    no_broker = msgspec.structs.replace(head, broker=None)
    assert title("Y", no_broker)[2] == "`python -m bench.x` on 2 cores."
    assert page(["x"]) == "x\n"
    assert cells(None) == "-" and cells(Spread(1234.5, 0.01234, 7)) == "1,234 / 0.0123 / 7.00"
    assert num(0) == "0" and num(float("nan")) == "nan"


def test_results_are_written_as_markdown_and_json_named_by_date_benchmark_and_quick(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chart = Results(tmp_path / "new", NOW, quick=True).path(".png")
    assert chart == tmp_path / "new" / "2026-12-07T0905Z-quick.png" and chart.parent.is_dir()
    chart.write_bytes(b"png")
    Results(tmp_path / "new", NOW, quick=True).write("# md\n", b"{}\n", chart)
    Results(tmp_path / "new", NOW, "gateway").write("# gw\n", b"[]\n")
    assert sorted(p.name for p in (tmp_path / "new").iterdir()) == [
        "2026-12-07T0905Z-gateway.json",
        "2026-12-07T0905Z-gateway.md",
        "2026-12-07T0905Z-quick.json",
        "2026-12-07T0905Z-quick.md",
        "2026-12-07T0905Z-quick.png",
    ]
    assert (tmp_path / "new" / "2026-12-07T0905Z-gateway.md").read_text() == "# gw\n"
    assert (tmp_path / "new" / "2026-12-07T0905Z-quick.json").read_bytes() == b"{}\n"
    out, err = capsys.readouterr()
    assert out == "# md\n\n# gw\n\n"
    md = tmp_path / "new" / "2026-12-07T0905Z-quick.md"
    assert f"written: {md}, {md.with_suffix('.json')}, {chart}\n" in err


def _heading(broker: str | None = None) -> dict[str, Any]:
    return {"date": "D", "command": "python -m bench.x", "machine": "2 cores", "broker": broker}


def test_the_gateway_states_report() -> None:
    report = gateway_state.Report(
        **_heading("given, b:1"),
        prompt_kb=33,
        latency=[gateway_state.Latency(0, 4.23, 8.04, 0.25, 0)],
        restart=gateway_state.Restart(1200, 1.26, 151.2),
        big=gateway_state.BigStarts(500, 900, 120.0, 130.4, None, None),
    )
    lines = gateway_state.markdown(report).splitlines()
    assert lines[0] == "# The gateway's state under open episodes, D"
    assert lines[2].endswith(
        "; broker: given, b:1; one client, each open episode after one call of a 33 KB prompt."
    )
    assert "| 0 | 4.23 | 8.04 | 0.250 | 0 |" in lines
    assert "Restart with 1200 open episodes: /healthz after 1.26 s, peak RSS 151 MB." in lines
    assert "500 starts with 900 KB prompts: RSS 120 -> 130 MB." in lines
    assert msgspec.json.decode(results_json(report), type=gateway_state.Report) == report


def test_the_parquet_report() -> None:
    encoded = {
        "jsonl": parquet.Encoded(records=10, bytes=4000, cpu_us=[3.0, 1.0, 2.0], load_s=[0.5] * 3),
        "parquet (zstd)": parquet.Encoded(
            records=10, bytes=1000, cpu_us=[9.0] * 3, load_s=[0.2] * 3
        ),
    }
    report = parquet.ParquetReport(**_heading(), rounds=3, workloads={"tokens": encoded})
    lines = parquet.markdown(report).splitlines()
    assert lines[:5] == [
        "# Parquet against JSON lines, D",
        "",
        "`python -m bench.x` on 2 cores.",
        "",
        "3 rounds, encodings alternating in order; shared machine.",
    ]
    assert (
        "| tokens (10) | jsonl | 4,000 | 1.00 | 1.00 / 2.00 / 3.00 | 0.500 / 0.500 / 0.500 |"
        in lines
    )
    smaller = "| 1,000 | 0.250 | 9.00 / 9.00 / 9.00 | 0.200 / 0.200 / 0.200 |"
    assert f"| tokens (10) | parquet (zstd) {smaller}" in lines
    assert msgspec.json.decode(results_json(report), type=parquet.ParquetReport) == report


def test_the_upload_report() -> None:
    rates = {"uploader": [100.0, 80.0, 90.0], "boto3": [200.0, 100.0, 150.0]}
    report = upload.UploadReport(
        **_heading(), s3="given, http://s3", files=8, bytes=134_217_728, rounds=3, mb_per_s=rates
    )
    lines = upload.markdown(report).splitlines()
    assert lines[2] == "`python -m bench.x` on 2 cores; S3: given, http://s3."
    assert (
        "8 files, 134 MB in all, 3 rounds; server and clients on the same shared machine." in lines
    )
    assert "| uploader | 80.0 / 90.0 / 100 |" in lines
    assert "| uploader / boto3, per round | 0.500 / 0.600 / 0.800 |" in lines
    data = msgspec.json.decode(upload.to_json(report))
    assert data["ratios"] == {"uploader / boto3": {"min": 0.5, "median": 0.6, "max": 0.8}}
    assert data["mb_per_s"] == rates and data["s3"] == "given, http://s3"


@pytest.mark.parametrize(
    "module", ["bench.gateway", "bench.gateway_state", "bench.parquet", "bench.upload"]
)
def test_every_results_writer_takes_the_results_option(module: str) -> None:
    """(``python -m bench`` and ``bench.tokens``: test_bench.py's help test.)"""
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: python -m {module} ")
    assert f"--results RESULTS where results go ({RESULTS})" in " ".join(out.stdout.split())
