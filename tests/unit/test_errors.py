"""Every error class of the package lives in stream_export/errors.py, under one root."""

from __future__ import annotations

import ast
import builtins
import inspect
from pathlib import Path

from stream_export import errors
from stream_export.errors import StreamExportError

PACKAGE = Path(errors.__file__).parent
#: Names that an exception class may be derived from: the builtin exceptions and
#: every class errors.py defines.
EXCEPTION_NAMES = {
    name
    for name, value in {**vars(builtins), **vars(errors)}.items()
    if inspect.isclass(value) and issubclass(value, BaseException)
}


def base_name(base: ast.expr) -> str:
    """The class a base names: ``Error`` for ``Error`` and ``errors.Error``, ``Base``
    for ``Base[T]``."""
    while isinstance(base, ast.Subscript):
        base = base.value
    if isinstance(base, ast.Attribute):
        return base.attr
    return base.id if isinstance(base, ast.Name) else ""


def is_exception_base(name: str) -> bool:
    return name in EXCEPTION_NAMES or name.endswith(("Error", "Exception"))


def test_no_module_but_errors_defines_an_exception() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != Path(errors.__file__)
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ClassDef)
        and any(is_exception_base(base_name(base)) for base in node.bases)
    ]
    assert not found, "define these in stream_export/errors.py: " + ", ".join(found)


def test_the_check_sees_every_way_of_naming_a_base() -> None:
    source = "class A(ValueError): ...\nclass B(errors.SinkError): ...\nclass C(X[KeyError]): ...\n"
    bases = [
        base_name(node.bases[0])
        for node in ast.parse(source).body
        if isinstance(node, ast.ClassDef)
    ]
    assert [is_exception_base(name) for name in bases] == [True, True, False]


def test_every_error_derives_from_the_root() -> None:
    defined = [
        value
        for value in vars(errors).values()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == errors.__name__
    ]
    assert len(defined) > 10
    assert all(issubclass(cls, StreamExportError) for cls in defined)
