"""Written files loaded with Hugging Face ``datasets``, offline: the ``load_json``
fixture, and :func:`load_folder` (a whole output folder, through its card)."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def load_json(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``datasets.load_dataset("json", ...)`` (or another builder, ``parquet``) with
    the hub switched off."""
    home = tmp_path_factory.mktemp("hf-home")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_DATASETS_OFFLINE", "1")
        env.setenv("HF_HUB_OFFLINE", "1")
        env.setenv("HF_HOME", str(home))
        datasets = importlib.import_module("datasets")

        def load(files: list[Path], builder: str = "json") -> Any:
            return datasets.load_dataset(
                builder,
                data_files=[str(f) for f in files],
                split="train",
                cache_dir=str(home / "cache"),
            )

        yield load


def load_folder(root: Path, home: Path) -> Any:
    """``datasets.load_dataset(<root>, split="train")``, as a trainer loads an output
    folder (its card's default config), with the hub switched off and ``home`` for
    its caches."""
    with pytest.MonkeyPatch.context() as env:
        for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
            env.setenv(name, "1")
        env.setenv("HF_HOME", str(home / "hf-home"))
        datasets = importlib.import_module("datasets")
        return datasets.load_dataset(str(root), split="train", cache_dir=str(home / "hf"))
