"""The pre-commit hooks run what the test command's linters run (dev/check), so
the two cannot drift: the same commands, in the same order, on the whole tree."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from pre_commit.clientlib import load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / ".pre-commit-config.yaml"


def _check_linters() -> list[list[str]]:
    """The commands dev/check runs before its tests (the ``.venv/bin`` tools but pytest)."""
    commands = [shlex.split(line) for line in (ROOT / "dev" / "check").read_text().splitlines()]
    tools = [c for c in commands if c and c[0].startswith(".venv/bin/")]
    assert tools[-1][0] == ".venv/bin/pytest", "dev/check ends with its tests"
    return tools[:-1]


def _hooks() -> list[dict[str, Any]]:
    """The hooks as pre-commit reads them (validated, defaults filled in)."""
    config = load_config(str(CONFIG))
    assert [repo["repo"] for repo in config["repos"]] == ["local"], "only local hooks"
    return [hook for repo in config["repos"] for hook in repo["hooks"]]


def test_the_hooks_are_the_linters_of_dev_check() -> None:
    hooks = _hooks()
    assert [[*shlex.split(h["entry"]), *h["args"]] for h in hooks] == _check_linters()
    for hook in hooks:
        # dev/check's own command on the whole tree, whatever file the commit changes.
        assert hook["language"] in {"system", "unsupported"}, hook["id"]
        assert hook["pass_filenames"] is False, hook["id"]
        assert (hook["files"], hook["exclude"], hook["types"], hook["types_or"]) == (
            "",
            "^$",
            ["file"],
            [],
        ), hook["id"]


def test_the_hooks_run_and_pass_on_the_tree(tmp_path: Path) -> None:
    """What a developer's commit runs: every hook, through pre-commit itself."""
    done = subprocess.run(
        [str(Path(sys.executable).with_name("pre-commit")), "run", "--all-files", "--color=never"],
        cwd=ROOT,
        env={**os.environ, "PRE_COMMIT_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ran = [line.split(".", 1)[0] for line in done.stdout.splitlines() if line.endswith("Passed")]
    assert ran == [hook["name"] for hook in _hooks()]
