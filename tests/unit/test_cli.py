"""The command line explains itself: --version, help with examples, and the settings
(every one listed from its section's module, the effective ones shown with secrets redacted)."""

from __future__ import annotations

import inspect
import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import msgspec
import pytest

from stream_export import __version__, cli
from stream_export.rows import columns, formats
from stream_export.settings import Settings, docs, env_names, field_types, load, values
from stream_export.settings.values import allowed, env_name

CLI = Path(sys.executable).with_name("stream-export")
COMMANDS = ["worker", "gateway", "demo", "produce", "topics", "follow", "export", "learn", "config"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    try:
        code = cli.main(list(args))
    except SystemExit as exc:  # argparse's --help and --version
        code = int(exc.code or 0)
    return code, capsys.readouterr().out


def test_version_from_the_installed_command() -> None:
    done = subprocess.run([str(CLI), "--version"], capture_output=True, text=True, timeout=30)
    assert (done.returncode, done.stdout) == (0, f"stream-export {__version__}\n")


def test_top_level_help_is_for_users_with_examples(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "--help")
    assert code == 0
    assert "GRPO training data" in out and "stream-export config list" in out
    listed = re.findall(r"^    (\w+) +\S", out.split("positional arguments:")[1], flags=re.M)
    assert listed == COMMANDS
    examples = out.split("examples:", 1)[1]
    for name in COMMANDS:
        assert f"stream-export {name}" in examples, f"no example for {name}"
    assert "exit codes:" in out
    assert "thin shell" not in out  # the module docstring is not the help


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_help_ends_with_examples(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    code, out = run(capsys, command, "--help")
    assert code == 0
    assert re.search(rf"examples:\n  (\S+=\S+ )?stream-export {command}\b", out), out


def test_config_list_describes_every_setting_from_config_py(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = run(capsys, "config", "list")
    assert code == 0
    blocks = out.strip().split("\n\n")
    types = field_types()
    assert [b.split()[0] for b in blocks] == list(types)
    for block, (key, annotation) in zip(blocks, types.items(), strict=True):
        assert f"({env_name(*key.split('.'))})" in block.splitlines()[0]
        assert f"allowed: {allowed(annotation)}" in block
    rotate = next(b for b in blocks if b.startswith("sink.rotate_bytes "))
    assert "integer, default 268435456" in rotate
    assert "allowed: an integer from 0 to 1099511627776" in rotate
    assert "Seal the active file at this size" in rotate  # the field's #: comment
    worker_id = next(b for b in blocks if b.startswith("worker.worker_id "))
    assert 'default "" (the host name)' in worker_id
    assert "choice or none, default none" in next(
        b for b in blocks if b.startswith("kafka.sasl_mechanism ")
    )


def test_every_setting_with_a_comment_in_its_section_carries_it() -> None:
    sections = [f.type for f in msgspec.structs.fields(Settings)]
    source = "".join(inspect.getsource(section) for section in sections)
    documented = len(re.findall(r"#:.*\n(?:\s+#:.*\n)*\s+\w+:", source))
    described = [s for s in docs.settings() if s.doc]
    assert len(described) == documented


def test_config_list_names_every_built_in_format_and_metadata_field() -> None:
    """The description `config list` prints for format.format (and metadata_fields)
    names every built-in format (and field) by name: tokens was missing."""
    described = {s.key: s.doc for s in docs.settings()}
    for name in formats.BUILTIN_FORMATS:
        assert re.search(rf"\b{name}\b", described["format.format"]), name
    for field in columns.METADATA:
        assert re.search(rf"\b{field}\b", described["format.metadata_fields"]), field


def test_config_show_is_the_effective_toml_with_secrets_redacted(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in env_names():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(values.CONFIG_ENV, raising=False)
    settings_file = tmp_path / "prod.toml"
    settings_file.write_text('[sink]\noutput_dir = "/data/out"\n')
    monkeypatch.setenv("STREAM_EXPORT_KAFKA_SASL_PASSWORD", "hunter2")
    monkeypatch.setenv("STREAM_EXPORT_WORKER_WORKER_ID", "w-7")
    args = ["--config", str(settings_file), "--set", "sink.rotate_bytes=5"]
    code, out = run(capsys, "config", "show", *args)
    assert code == 0
    assert "hunter2" not in out
    assert 'sasl_password = "***"  # from STREAM_EXPORT_KAFKA_SASL_PASSWORD' in out
    assert f'output_dir = "/data/out"  # from {settings_file}' in out
    assert "rotate_bytes = 5  # from --set" in out
    assert "# sasl_mechanism = (not set)" in out
    code, shown_json = run(capsys, "config", "show", "--json", *args)
    data = json.loads(shown_json)
    assert data["kafka"]["sasl_password"] == "***" and data["sink"]["rotate_bytes"] == 5
    assert "hunter2" not in shown_json
    # It is a settings file: loading it again gives the same settings.
    again = tmp_path / "again.toml"
    again.write_text(out)
    assert tomllib.loads(out)["sink"]["rotate_bytes"] == 5
    shown = load(file=again, env={})
    expected = load(file=settings_file, env={}, overrides=args[3:])
    expected.worker.worker_id = "w-7"
    expected.kafka.sasl_password = values.Secret("***")
    assert msgspec.to_builtins(shown, enc_hook=str) == msgspec.to_builtins(expected, enc_hook=str)


def test_config_show_refuses_a_bad_setting_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = cli.main(["config", "show", "--set", "http.port=70000"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == (
        "stream-export: config: invalid setting http.port=70000: must be an integer "
        "from 1 to 65535 (from --set)\n"
    )


def test_the_docs_show_a_block_config_list_prints() -> None:
    readme = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    shown = re.search(r"\n((?:    sink\.rotate_bytes .*\n)(?:        .*\n)+)", readme)
    assert shown, "the config list example is missing from docs/configuration.md"
    text = "\n".join(line.removeprefix("    ") for line in shown.group(1).splitlines())
    assert text in docs.render_list().split("\n\n")
