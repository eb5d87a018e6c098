"""`where:` filter expressions of a scenario sweep, e.g. `"tp * pp <= 64"`.

Owns a small, safe expression language parsed with Python's `ast` (never eval): names
(each one of the allowed names the caller gives, e.g. the scenario's run keys), int, float
and string constants, True/False, the arithmetic operators + - * / // % and unary -,
comparisons (== != < <= > >=, chained), `and`, `or`, `not` and parentheses. Anything else
(calls, attributes, subscripts, lambdas, comprehensions, `**`) is refused when the
expression is compiled, so a typo fails before any run is built. Standard library only.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from zsim.errors import ConfigError

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge}

MAX_LENGTH = 1000
"""Longest expression accepted, characters (deeper nesting than a filter needs makes
Python's parser recurse)."""


@dataclass(frozen=True, slots=True)
class Expression:
    """A checked expression; `evaluate` gives its value for one binding of its names."""

    text: str
    """The expression as written."""
    field: str
    """Field path errors name, e.g. `where`."""
    tree: ast.expr

    def evaluate(self, values: Mapping[str, Any]) -> Any:
        """The expression's value with each name bound to `values[name]`.

        Raises:
            ConfigError: a name missing from `values`, a type mismatch (e.g. a number
                compared with a string by <) or a division by zero; field `self.field`.
        """
        try:
            return _eval(self.tree, values)
        except KeyError as e:
            raise ConfigError(self.field, self.text, f"{e.args[0]} has no value") from None
        except (TypeError, ZeroDivisionError, OverflowError) as e:
            raise ConfigError(self.field, self.text, f"cannot evaluate ({e})") from None


def compile_expression(text: Any, *, field: str, names: tuple[str, ...]) -> Expression:
    """Parse and check an expression over `names`.

    Args:
        text: the expression (from YAML: anything; only a non-empty str is accepted).
        field: the field path errors name.
        names: the names it may read.

    Raises:
        ConfigError: not a string, a syntax error, a construct outside the language, or
            a name not in `names` (the message lists them).
    """
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(field, text, "must be an expression string, e.g. \"gpus <= 64\"")
    if len(text) > MAX_LENGTH:
        raise ConfigError(field, text, f"longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        reason = e.msg if isinstance(e, SyntaxError) else type(e).__name__
        raise ConfigError(field, text, f"not an expression ({reason})") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise ConfigError(field, text, f"unknown name {node.id!r}; names: "
                                  f"{', '.join(names)}")
        elif not _allowed(node):
            raise ConfigError(field, text, f"{_construct(node)} is not allowed; use "
                              "names, numbers, strings, + - * / // %, comparisons, and, "
                              "or, not, parentheses")
    return Expression(text=text, field=field, tree=tree)


def _allowed(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (bool, int, float, str))
    if isinstance(node, ast.BinOp):
        return type(node.op) in _BINARY
    if isinstance(node, ast.UnaryOp):
        return isinstance(node.op, (ast.USub, ast.UAdd, ast.Not))
    if isinstance(node, ast.Compare):
        return all(type(op) in _COMPARE for op in node.ops)
    return isinstance(node, (ast.BoolOp, ast.And, ast.Or, ast.Load, *_BINARY, *_COMPARE,
                             ast.USub, ast.UAdd, ast.Not))


def _construct(node: ast.AST) -> str:
    """The construct's name in errors: the operator for an operation (Pow, In, BitAnd)."""
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        return type(node.op).__name__
    if isinstance(node, ast.Compare):
        return next(type(op).__name__ for op in node.ops if type(op) not in _COMPARE)
    return type(node).__name__


def _eval(node: ast.expr, values: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return values[node.id]
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, values), _eval(node.right, values)
        if isinstance(left, str) or isinstance(right, str):
            # "a" * 10**12 would build a terabyte string: strings only compare.
            raise TypeError("arithmetic on a string")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        operand = _eval(node.operand, values)
        if isinstance(node.op, ast.Not):
            return not operand
        return -operand if isinstance(node.op, ast.USub) else +operand
    if isinstance(node, ast.BoolOp):
        if isinstance(node.op, ast.And):
            return all(_eval(v, values) for v in node.values)
        return any(_eval(v, values) for v in node.values)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, values)
        for op, comparator in zip(node.ops, node.comparators, strict=True):
            right = _eval(comparator, values)
            if not _COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    raise TypeError(f"{type(node).__name__} in a checked expression")  # compile_expression
