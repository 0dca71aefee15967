"""Old import paths, kept working after the tree was reorganised: each name an old
module gave resolves from the module that holds it now, with a DeprecationWarning
naming the new path; a name the old module no longer has fails with an ImportError
saying where to look.

``import stream_export.config`` (or ``from stream_export.events import Step``) keeps
working for a release; new code imports the new paths.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any, Final

#: Old module -> the modules that now hold what it gave, searched in order.
MOVED: Final[dict[str, tuple[str, ...]]] = {
    "stream_export.config": ("stream_export.settings",),
    "stream_export.events": (
        "stream_export.contract.events",
        "stream_export.contract.decoding",
        "stream_export.contract.episode",
    ),
    "stream_export.calls": ("stream_export.contract.calls",),
    "stream_export.scores": ("stream_export.contract.scores", "stream_export.assemble.scoring"),
    "stream_export.reasons": ("stream_export.contract.reasons",),
    "stream_export.widths": ("stream_export.contract.widths",),
}


class _Moved(types.ModuleType):
    """An old module: every attribute is looked up in the new modules."""

    def __init__(self, name: str, homes: tuple[str, ...]) -> None:
        super().__init__(name, f"Moved: see {', '.join(homes)}.")
        self._homes = homes

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        for home in self._homes:
            module = importlib.import_module(home)
            if hasattr(module, attr):
                warnings.warn(
                    f"{self.__name__}.{attr} moved: import it from {home}",
                    DeprecationWarning,
                    stacklevel=2,
                )
                return getattr(module, attr)
        raise ImportError(
            f"{self.__name__} moved to {', '.join(self._homes)}, which have no {attr!r}",
            name=self.__name__,
        )


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return _Moved(spec.name, MOVED[spec.name])

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: the module answers from its new homes."""


def install() -> None:
    """Resolve the old paths (once per process)."""
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.append(_Finder())
