"""A tmpfs mounted for one test (the tests run as root, as CI does)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def tmpfs(directory: Path, options: str) -> Iterator[Path]:
    """Mount a tmpfs with ``options`` (e.g. ``size=2m``, ``ro``) on a new ``directory``."""
    directory.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(directory)], check=True)
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=True)
