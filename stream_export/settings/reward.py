"""``scores.reward``: an episode's reward as an expression over its named scores.

Parsed once with :mod:`ast` and evaluated by walking the tree: numbers, score
names, ``+ - * /``, unary minus, parentheses and ``min(...)`` / ``max(...)``;
anything else (attributes, other calls, comparisons, subscripts) is refused
when the settings load. Never ``eval``. Pure.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable, Mapping
from typing import Final

from stream_export.errors import ConfigError

_BINARY: Final[dict[type[ast.operator], Callable[[float, float], float]]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_CALLS: Final[dict[str, Callable[..., float]]] = {"min": min, "max": max}


class RewardExpression:
    """A checked expression; :meth:`evaluate` gives None when a name it uses has no
    value (a missing score) or the result is not a finite number."""

    def __init__(self, text: str) -> None:
        self.text = text
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as exc:
            raise ConfigError(
                f"invalid setting scores.reward={text!r}: not an expression ({exc.msg})"
            ) from None
        self._body = tree.body
        self.names: frozenset[str] = frozenset(self._check(tree.body))

    def _check(self, node: ast.expr) -> set[str]:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return set()
        if isinstance(node, ast.Name):
            return {node.id}
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return self._check(node.left) | self._check(node.right)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            return self._check(node.operand)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in _CALLS
            and node.args
            and not node.keywords
        ):
            return set().union(*(self._check(arg) for arg in node.args))
        raise ConfigError(
            f"invalid setting scores.reward={self.text!r}: {ast.unparse(node)!r} is not allowed "
            "(numbers, score names, + - * /, parentheses, min() and max() are)"
        )

    def evaluate(self, values: Mapping[str, float]) -> float | None:
        try:
            result = self._value(self._body, values)
        except (KeyError, ZeroDivisionError, OverflowError):
            return None
        return result if math.isfinite(result) else None

    def _value(self, node: ast.expr, values: Mapping[str, float]) -> float:
        if isinstance(node, ast.Constant):
            return float(node.value)  # type: ignore[arg-type]  # _check allows numbers only
        if isinstance(node, ast.Name):
            return values[node.id]
        if isinstance(node, ast.BinOp):
            op = _BINARY[type(node.op)]
            return op(self._value(node.left, values), self._value(node.right, values))
        if isinstance(node, ast.UnaryOp):
            value = self._value(node.operand, values)
            return -value if isinstance(node.op, ast.USub) else value
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
        return _CALLS[node.func.id](*(self._value(arg, values) for arg in node.args))
