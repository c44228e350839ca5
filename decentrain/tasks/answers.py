r"""Pure scorers for the vetted tasks: strict parsers of each task's answer format, compared here.

A completion is text a stranger wrote. Each scorer parses it, under a length cap, into plain data
(an int, a list of ints or strings, a polynomial as {monomial: coefficient}) with a small
hand-written parser, and compares that with the entry this node rebuilt itself. Nothing here
evaluates text: no eval/exec/compile, no sympy parsing, no `ast.literal_eval`
(tests/unit/test_task_security.py greps the library for them). reasoning-gym's own
`score_answer` is not called at all: five of the nine vetted tasks `eval` the completion or
sympy-parse it, and an in-process audit hook around them was escaped through the object graph.

Each scorer reproduces reasoning-gym's `score_answer` on well-formed answers and never scores
higher than it (tests/unit/test_scorer_vs_reasoning_gym.py compares them on honest answers and on
hostile variants). Departures, all towards scoring *less* exotic syntax:
  - digits and spaces are ASCII only (`re.ASCII`, `ASCII_SPACE`): Python's `\d`, `\s`, `int`,
    `float`, `Decimal` and `str.strip` also take Arabic-Indic digits or U+2003, which let a
    polynomial in Arabic-Indic digits score 1 where reasoning-gym's sympy gives 0;
  - Python-literal partial credit (string_insertion, spiral_matrix, binary_matrix) accepts
    lists/tuples of int and quoted-string literals without escapes, nested at most twice;
  - polynomial_multiplication accepts sums of products of integers and the entry's variables
    with integer powers (no parentheses, division or floats), compared after collecting terms;
  - number_sorting refuses NaN and infinities (reasoning-gym scores a list of "nan" as sorted
    and within tolerance, i.e. 1.0).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from decimal import Decimal, InvalidOperation
from typing import Any, Callable

from decentrain.core.registry import Registry

# Longer answers are malformed before any parsing, unless the entry's own answer is long (see
# `answer_cap`): the cap follows the task's configured size, so an honest answer to a large
# spiral_matrix is not charged to its sender as malformed.
MAX_ANSWER_CHARS = 4096
ANSWER_CAP_FACTOR = 4  # an answer may be this many times the oracle's length (other spacing, order, format)
ASCII_SPACE = " \t\n\r\x0b\x0c"  # what str.strip() removes, less Unicode spaces (U+2003, U+3000, ...)

Scorer = Callable[[str, dict[str, Any]], float]
SCORERS: Registry[Scorer] = Registry("task scorer")


class Malformed(ValueError):
    """An answer that does not parse in its task's format (scores 0, counted against its sender)."""


def answer_cap(entry: dict[str, Any]) -> int:
    """The longest answer parsed for `entry`: MAX_ANSWER_CHARS, or ANSWER_CAP_FACTOR x its oracle answer."""
    return max(MAX_ANSWER_CHARS, ANSWER_CAP_FACTOR * len(str(entry["answer"])))


def score(task: str, answer: str | None, entry: dict[str, Any]) -> float:
    """`task`'s score in [0, 1] of `answer` against the locally built `entry`; Malformed if it does not parse."""
    if answer is None:
        return 0.0
    if not isinstance(answer, str) or len(answer) > answer_cap(entry):
        raise Malformed("answer too long")
    value = float(SCORERS.get(task, "task")(answer, entry))
    return min(max(value, 0.0), 1.0) if math.isfinite(value) else 0.0


# -- shared parsers ------------------------------------------------------------------------------

_LITERAL_TOKEN = re.compile(
    r"""\s*(?:(?P<int>[+-]?\d{1,40})|(?P<str>'[^'\\\n]*'|"[^"\\\n]*")|(?P<punct>[\[\](),]))""", re.ASCII
)
_MAX_DEPTH = 2


def parse_literal(text: str) -> Any:
    """A Python literal made of ints, quoted strings (no escapes) and lists/tuples nested at most twice.

    Returns ints, strs and lists (tuples become lists); Malformed for anything else.
    """
    tokens: list[tuple[str, Any]] = []
    pos, text = 0, text.rstrip(ASCII_SPACE)
    while pos < len(text):
        m = _LITERAL_TOKEN.match(text, pos)
        if m is None:
            raise Malformed("not a literal")
        pos = m.end()
        if m.group("int") is not None:
            tokens.append(("value", int(m.group("int"))))
        elif m.group("str") is not None:
            tokens.append(("value", m.group("str")[1:-1]))
        else:
            tokens.append((m.group("punct"), None))
    value, end = _parse_value(tokens, 0, 0)
    if end != len(tokens):
        raise Malformed("trailing tokens")
    return value


def _parse_value(tokens: list[tuple[str, Any]], i: int, depth: int) -> tuple[Any, int]:
    if i >= len(tokens):
        raise Malformed("unexpected end")
    kind, value = tokens[i]
    if kind == "value":
        return value, i + 1
    if kind not in "[(" or depth >= _MAX_DEPTH:
        raise Malformed("unexpected token")
    close = "]" if kind == "[" else ")"
    out: list[Any] = []
    i += 1
    while True:
        if i < len(tokens) and tokens[i][0] == close:
            return out, i + 1
        item, i = _parse_value(tokens, i, depth + 1)
        out.append(item)
        if i < len(tokens) and tokens[i][0] == ",":
            i += 1
        elif i >= len(tokens) or tokens[i][0] != close:
            raise Malformed("expected ',' or a closing bracket")


def _items(value: Any) -> list[Any]:
    """What Python's iteration gives for a parsed literal: a list's items or a string's characters."""
    if isinstance(value, (list, str)):
        return list(value)
    raise Malformed("not iterable")


# -- tasks that compare strings or numbers -------------------------------------------------------


@SCORERS.register("basic_arithmetic")
@SCORERS.register("leg_counting")
def exact_or_substring(answer: str, entry: dict[str, Any]) -> float:
    """reasoning-gym's default: 1 for the oracle answer, len(oracle)/len(answer) if it contains it."""
    oracle = str(entry["answer"])
    if answer == oracle:
        return 1.0
    return len(oracle) / len(answer) if answer and oracle in answer else 0.0


# What Python's float/Decimal read, in ASCII only (they also take Unicode digits and spaces, "1_0");
# ASCII spaces around it are stripped first, as float and Decimal do.
_ASCII_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)


@SCORERS.register("chain_sum")
def decimal_equal(answer: str, entry: dict[str, Any]) -> float:
    """Equal as decimals after dropping commas ("+01,000.00" == "1000"), else the substring rule."""
    if not answer:
        return 0.0
    oracle = str(entry["answer"]).replace(",", "")
    plain = answer.replace(",", "")
    try:
        # Decimal parses a number and evaluates nothing, but also takes Unicode digits and spaces
        if _ASCII_NUMBER.fullmatch(plain.strip(ASCII_SPACE)) and Decimal(plain) == Decimal(oracle):
            return 1.0
    except (InvalidOperation, ValueError):
        pass
    return len(oracle) / len(plain) if oracle in plain else 0.0


@SCORERS.register("word_sorting")
def word_list(answer: str, entry: dict[str, Any]) -> float:
    oracle = list(entry["metadata"]["sorted_words"])
    if not answer:
        return 0.0
    words = [w.strip(ASCII_SPACE) for w in re.split(r",\s*", answer, flags=re.ASCII)]
    if words == oracle:
        return 1.0
    partial = sum(1 for i, w in enumerate(words) if i < len(oracle) and w == oracle[i]) / len(oracle)
    if Counter(words) == Counter(oracle):
        partial = max(partial, 0.2)
    return partial


@SCORERS.register("number_sorting")
def sorted_numbers(answer: str, entry: dict[str, Any]) -> float:
    """A JSON list (single quotes allowed) of finite numbers, sorted the asked way, each within 1."""
    expected = [float(x) for x in entry["metadata"]["sorted_numbers"]]
    try:
        values = json.loads(answer.replace("'", '"'), parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        raise Malformed("not a JSON list") from None
    if not isinstance(values, list):
        raise Malformed("not a JSON list")
    if len(values) != len(expected):
        return 0.0
    numbers = []
    for v in values:
        if not isinstance(v, (bool, int, float, str)) or (
            isinstance(v, str) and not _ASCII_NUMBER.fullmatch(v.strip(ASCII_SPACE))
        ):
            raise Malformed("not a number")
        try:
            x = float(v)
        except (ValueError, OverflowError):
            raise Malformed("not a number") from None
        if not math.isfinite(x):
            raise Malformed("not a finite number")
        numbers.append(x)
    descending = entry["metadata"]["direction"] != "ascending"
    if numbers != sorted(numbers, reverse=descending):
        return 0.0
    return 1.0 if all(abs(a - b) <= 1 for a, b in zip(numbers, expected)) else 0.0


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number here")


# -- tasks whose partial credit reads a Python list ----------------------------------------------


@SCORERS.register("string_insertion")
def string_or_char_list(answer: str, entry: dict[str, Any]) -> float:
    """1 for the string; 0.1 for a list of strings that joins to it."""
    oracle = entry["answer"]
    if answer == oracle:
        return 1.0
    items = _items(parse_literal(answer))
    if not all(isinstance(x, str) for x in items):
        raise Malformed("not a list of strings")
    return 0.1 if "".join(items) == oracle else 0.0


@SCORERS.register("spiral_matrix")
def spaced_ints(answer: str, entry: dict[str, Any]) -> float:
    """1 for the space-separated numbers; 0.1 for a list whose items print as them."""
    oracle = entry["answer"].strip()
    answer = answer.strip(ASCII_SPACE)
    if not answer:
        return 0.0
    if answer == oracle:
        return 1.0
    items = _items(parse_literal(answer))
    if any(isinstance(x, list) for x in items):
        return 0.0  # a nested list prints with brackets, never as the oracle
    return 0.1 if " ".join(str(x) for x in items) == oracle else 0.0


@SCORERS.register("binary_matrix")
def int_matrix(answer: str, entry: dict[str, Any]) -> float:
    """1 for the matrix text (rows on lines); 0.1 for a list of rows that prints as it."""
    oracle = entry["answer"]
    if answer == oracle:
        return 1.0
    rows = _items(parse_literal(answer))
    text = "\n".join(" ".join(str(x) for x in _items(row)) for row in rows)
    return 0.1 if text == oracle else 0.0


# -- polynomials ---------------------------------------------------------------------------------

_POLY_TOKEN = re.compile(r"\s*(?:(?P<int>\d{1,60})|(?P<name>[A-Za-z_]\w{0,15})|(?P<op>\*\*|[*+-]))", re.ASCII)
_MAX_EXPONENT = 1000
_MAX_COEFFICIENT_BITS = 4096

Monomial = tuple[tuple[str, int], ...]


def parse_polynomial(text: str, variables: frozenset[str]) -> dict[Monomial, int]:
    """`text` as {monomial: coefficient}: a sum of products of integers and `variables` with integer powers."""
    tokens: list[tuple[str, str]] = []
    pos, text = 0, text.rstrip(ASCII_SPACE)
    while pos < len(text):
        m = _POLY_TOKEN.match(text, pos)
        if m is None:
            raise Malformed("not a polynomial")
        pos = m.end()
        kind = m.lastgroup or ""
        tokens.append((kind, m.group(kind)))
    poly: Counter[Monomial] = Counter()
    i = 0
    while i < len(tokens):
        if i and tokens[i] not in (("op", "+"), ("op", "-")):
            raise Malformed("expected '+' or '-' between terms")
        coefficient, powers, i = _parse_term(tokens, i, variables)
        poly[tuple(sorted(powers.items()))] += coefficient
    if not tokens:
        raise Malformed("empty")
    return {m: c for m, c in poly.items() if c}


def _parse_term(tokens: list[tuple[str, str]], i: int, variables: frozenset[str]) -> tuple[int, Counter, int]:
    coefficient, powers = 1, Counter()
    while True:
        while i < len(tokens) and tokens[i][0] == "op" and tokens[i][1] in "+-":  # signs, as Python reads them
            coefficient = -coefficient if tokens[i][1] == "-" else coefficient
            i += 1
        if i >= len(tokens) or tokens[i][0] not in ("int", "name"):
            raise Malformed("expected a number or a variable")
        kind, atom = tokens[i]
        i += 1
        exponent = 1
        if i < len(tokens) and tokens[i] == ("op", "**"):
            sign = 1
            i += 1
            if i < len(tokens) and tokens[i] in (("op", "-"), ("op", "+")):
                sign = -1 if tokens[i][1] == "-" else 1
                i += 1
            if i >= len(tokens) or tokens[i][0] != "int" or int(tokens[i][1]) > _MAX_EXPONENT:
                raise Malformed("exponent must be an integer <= 1000")
            exponent = sign * int(tokens[i][1])
            i += 1
        if kind == "name":
            if atom not in variables:
                raise Malformed("unknown name")
            powers[atom] += exponent
        else:
            if exponent < 0 or int(atom).bit_length() * exponent > _MAX_COEFFICIENT_BITS:
                raise Malformed("integer power out of range")
            coefficient *= int(atom) ** exponent
        if coefficient.bit_length() > _MAX_COEFFICIENT_BITS:
            raise Malformed("coefficient too large")
        if i < len(tokens) and tokens[i] == ("op", "*"):
            i += 1
            continue
        powers = Counter({v: e for v, e in powers.items() if e})
        return coefficient, powers, i


@SCORERS.register("polynomial_multiplication")
def polynomial_equal(answer: str, entry: dict[str, Any]) -> float:
    """1 if the answer expands to the same polynomial as the entry's (terms collected, any order)."""
    variables = frozenset(entry["metadata"]["variables"])
    return 1.0 if parse_polynomial(answer, variables) == parse_polynomial(entry["answer"], variables) else 0.0
