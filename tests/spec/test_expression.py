"""`where:` expressions: Python's arithmetic and comparison semantics on the whitelisted
constructs (checked against Python itself on the same text), and every construct outside
the language refused when compiled, naming the field and the text."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zsim.errors import ConfigError
from zsim.spec.expression import compile_expression

NAMES = ("gpus", "unit_size", "strategy", "seq_len")
VALUES = {"gpus": 64, "unit_size": 2, "strategy": "fsdp", "seq_len": 8192}


@pytest.mark.parametrize("text", [
    "gpus * unit_size <= 128", "gpus // 8 == 8", "gpus % 3", "-gpus + 70", "gpus / 3",
    "strategy == 'fsdp' and gpus > 8", "not strategy != \"fsdp\"", "8 < gpus <= 64",
    "8 < gpus < 64", "(gpus + 1) * 2 - seq_len / 1024", "gpus > 100 or unit_size == 2",
    "True", "seq_len >= 4096 and (unit_size == 1 or gpus == 64)",
])
def test_values_agree_with_python(text: str) -> None:
    expr = compile_expression(text, field="where", names=NAMES)
    # The reference: Python's own evaluation of the same text over the same names.
    assert expr.evaluate(VALUES) == eval(text, {"__builtins__": {}}, dict(VALUES))


@pytest.mark.parametrize(("text", "needle"), [
    ("tp * pp <= 64", "unknown name 'tp'"),
    ("gpus ** 2 > 1", "Pow"),
    ("__import__('os')", "Call"),
    ("gpus.real > 1", "Attribute"),
    ("[gpus][0] == 64", "Subscript"),
    ("lambda: 1", "Lambda"),
    ("gpus if gpus else 1", "IfExp"),
    ("gpus in (8, 16)", "In"),
    ("gpus is None", "Is"),
    ("gpus <=", "not an expression"),
    ("gpus = 8", "not an expression"),
    ("", "must be an expression string"),
    (64, "must be an expression string"),
    ("gpus & 1", "BitAnd"),
])
def test_constructs_outside_the_language_are_refused(text: object, needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        compile_expression(text, field="where", names=NAMES)
    assert (e.value.field, e.value.value) == ("where", text)
    assert needle in e.value.reason


@pytest.mark.parametrize(("text", "needle"), [
    ("gpus / (unit_size - 2) > 1", "division by zero"),
    ("strategy < 3", "not supported"),
    ("strategy * 1000000000000 == ''", "arithmetic on a string"),
])
def test_evaluation_errors_are_config_errors(text: str, needle: str) -> None:
    expr = compile_expression(text, field="where", names=NAMES)
    with pytest.raises(ConfigError) as e:
        expr.evaluate(VALUES)
    assert (e.value.field, e.value.value) == ("where", text)
    assert needle in e.value.reason


ARITH = st.recursive(
    st.one_of(st.sampled_from(["gpus", "unit_size", "seq_len"]),
              st.integers(-9, 99).map(str), st.sampled_from(["0.5", "2.0"])),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*", "/", "//", "%"]), inner)
        .map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        inner.map(lambda e: f"-{e}")),
    max_leaves=8)
BOOLEAN = st.recursive(
    st.tuples(ARITH, st.sampled_from(["==", "!=", "<", "<=", ">", ">="]), ARITH)
    .map(lambda t: f"{t[0]} {t[1]} {t[2]}"),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["and", "or"]), inner)
        .map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        inner.map(lambda e: f"not ({e})")),
    max_leaves=4)


@given(text=BOOLEAN, gpus=st.integers(1, 4096), unit_size=st.integers(0, 8))
def test_generated_filters_agree_with_python(text: str, gpus: int, unit_size: int) -> None:
    """Random filters over the whitelisted grammar: the same value as Python's own
    evaluation, or a ConfigError exactly where Python raises (division by zero)."""
    values = {"gpus": gpus, "unit_size": unit_size, "seq_len": 4096}
    expr = compile_expression(text, field="where", names=NAMES)
    try:
        expected = eval(text, {"__builtins__": {}}, dict(values))
    except ZeroDivisionError:
        with pytest.raises(ConfigError):
            expr.evaluate(values)
        return
    assert expr.evaluate(values) == expected
