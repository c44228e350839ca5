"""A strict Redcode-94 parser: warrior text (from a model or a peer) -> plain data, or a reason why not.

Warrior text is data. It reaches pMARS only as this module's canonical rendering (explicit
modifiers and modes, numeric fields, no labels, macros, `;assert`s or `for` loops), never as
the text a model or a peer wrote. The accepted language is the ICWS'94 draft's instruction set
without p-space (`LDP`/`STP`), with labels, `EQU` constants, `ORG` and `END`; pMARS's
preprocessor features (`FOR`/`ROF`, `;assert` expressions, predefined constants) are refused,
which is the departure from what pMARS itself would assemble.

`parse` is total: for any string it returns a `ParseResult` (a `Warrior`, or None and one short
reason). Sizes are checked before work is done: the text's length first, then lines, then
instructions and label counts, and every number's digits before `int()` sees them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

OPCODES = (
    "DAT",
    "MOV",
    "ADD",
    "SUB",
    "MUL",
    "DIV",
    "MOD",
    "JMP",
    "JMZ",
    "JMN",
    "DJN",
    "SPL",
    "SLT",
    "CMP",
    "SEQ",
    "SNE",
    "NOP",
)
MODIFIERS = ("A", "B", "AB", "BA", "F", "X", "I")
MODES = "#$@<>*{}"
_ARITH = ("ADD", "SUB", "MUL", "DIV", "MOD")
_ONE_OPERAND_B_ZERO = ("JMP", "SPL", "NOP")  # `JMP x` means `JMP x, $0`

_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,31}", re.ASCII)
_TOKEN = re.compile(r"\s*(?:(\d{1,9})|([A-Za-z_][A-Za-z0-9_]{0,31})|([+-]))", re.ASCII)
_FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.S)


@dataclass
class RedcodeLimits:
    max_chars: int = 16_000  # before anything else is read
    max_lines: int = 400
    max_instructions: int = 100  # pMARS's MAXLENGTH
    core_size: int = 8000  # numbers are folded into [0, core_size)

    def __post_init__(self) -> None:
        # pMARS assembles at most 1000 instructions (MAXINSTR); the core bound is PMarsConfig's
        for name, high in (
            ("max_chars", 1 << 20),
            ("max_lines", 100_000),
            ("max_instructions", 1000),
            ("core_size", 1 << 20),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
                raise ValueError(f"redcode.{name}={value!r} must be an integer in [1, {high}]")


@dataclass(frozen=True)
class Instruction:
    opcode: str
    modifier: str
    a_mode: str
    a: int
    b_mode: str
    b: int

    def render(self) -> str:
        return f"{self.opcode}.{self.modifier} {self.a_mode}{self.a}, {self.b_mode}{self.b}"


@dataclass(frozen=True)
class Warrior:
    instructions: tuple[Instruction, ...]
    start: int = 0

    def render(self, name: str = "w") -> str:
        """The only text pMARS ever sees: canonical, fully numeric, named by this node."""
        body = "\n".join(i.render() for i in self.instructions)
        return f";redcode-94\n;name {name}\n;assert 1\nORG {self.start}\n{body}\nEND\n"

    @property
    def unique_opcodes(self) -> int:
        return len({i.opcode for i in self.instructions})

    def __len__(self) -> int:
        return len(self.instructions)


@dataclass(frozen=True)
class ParseResult:
    warrior: Warrior | None
    error: str | None = None


class _Refused(Exception):
    """Raised inside this module only; `parse` turns it into a ParseResult."""


def default_modifier(opcode: str, a_mode: str, b_mode: str) -> str:
    """ICWS'94 draft section 2.5: the modifier an instruction written without one gets."""
    if opcode in ("DAT", "NOP"):
        return "F"
    if opcode in ("MOV", "SEQ", "SNE", "CMP"):
        return "AB" if a_mode == "#" else "B" if b_mode == "#" else "I"
    if opcode in _ARITH:
        return "AB" if a_mode == "#" else "B" if b_mode == "#" else "F"
    if opcode == "SLT":
        return "AB" if a_mode == "#" else "B"
    return "B"  # JMP JMZ JMN DJN SPL


def _strip_comment(line: str) -> str:
    return line.split(";", 1)[0].strip()


def code_block(text: str) -> str:
    """A model's answer: the first fenced block if there is one, else the whole text."""
    m = _FENCE.search(text)
    return m.group(1) if m else text


def _expression(text: str, labels: dict[str, int], constants: dict[str, int], here: int, core: int) -> int:
    """`term (('+'|'-') term)*`: a term is an integer, a label (made relative to `here`) or an EQU name."""
    pos, total, sign, expect_term = 0, 0, 1, True
    text = text.strip()
    if not text:
        raise _Refused("empty operand")
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            raise _Refused("bad operand")
        pos = m.end()
        number, name, op = m.groups()
        if op is not None:
            if not expect_term:
                sign, expect_term = 1, True
            sign = -sign if op == "-" else sign  # also a unary sign: `--3` is 3
            continue
        if not expect_term:
            raise _Refused("missing operator")
        if number is not None:
            value = int(number)  # at most 9 digits (the token's pattern)
        elif name.upper() in labels:
            value = labels[name.upper()] - here
        elif name.upper() in constants:
            value = constants[name.upper()]
        else:
            raise _Refused("unknown label")
        total, sign, expect_term = total + sign * value, 1, False
        if not text[pos:].strip():
            break
    if expect_term:
        raise _Refused("dangling operator")
    return total % core


def _operand(text: str, labels: dict[str, int], constants: dict[str, int], here: int, core: int) -> tuple[str, int]:
    text = text.strip()
    mode = "$"
    if text[:1] and text[0] in MODES:
        mode, text = text[0], text[1:]
    return mode, _expression(text, labels, constants, here, core)


def _split_line(line: str) -> tuple[str | None, str, str]:
    """(label or None, opcode-ish word with any `.modifier`, rest)."""
    parts = line.split(None, 1)
    first, rest = parts[0], parts[1] if len(parts) > 1 else ""
    word = first.rstrip(":")
    if word.split(".", 1)[0].upper() in OPCODES or word.upper() in ("ORG", "END", "EQU"):
        return None, first, rest
    if not _LABEL.fullmatch(word):
        raise _Refused("bad label")
    parts = rest.split(None, 1)
    if not parts:
        return word, "", ""
    return word, parts[0], parts[1] if len(parts) > 1 else ""


def _parse(text: str, limits: RedcodeLimits) -> Warrior:
    if not isinstance(text, str):
        raise _Refused("not text")
    if len(text) > limits.max_chars:
        raise _Refused("too long")
    lines = [_strip_comment(ln) for ln in code_block(text).splitlines()]
    lines = [ln for ln in lines if ln]
    if len(lines) > limits.max_lines:
        raise _Refused("too many lines")
    core = limits.core_size
    # Pass 1: label addresses and EQU texts; instructions as (address, opcode word, operand text).
    labels: dict[str, int] = {}
    equs: dict[str, str] = {}
    rows: list[tuple[int, str, str]] = []
    org: str | None = None
    pending: list[str] = []
    for line in lines:
        label, word, rest = _split_line(line)
        key = word.upper()
        if label is not None and key == "EQU":
            if label.upper() in labels or label.upper() in equs:
                raise _Refused("label defined twice")
            equs[label.upper()] = rest
            continue
        if label is not None:
            pending.append(label.upper())
        if not word:
            continue
        if key == "END":
            org = rest.strip() or org
            break
        if key == "ORG":
            org = rest.strip()
            continue
        for name in pending:
            if name in labels or name in equs:
                raise _Refused("label defined twice")
            labels[name] = len(rows)
        pending = []
        if len(rows) >= limits.max_instructions:
            raise _Refused("too many instructions")
        rows.append((len(rows), word, rest))
    if not rows:
        raise _Refused("no instructions")
    # EQU values are plain numbers (no labels inside them: nothing recursive to resolve).
    constants = {k: _expression(v, {}, {}, 0, core) for k, v in equs.items()}
    out = [_instruction(word, rest, labels, constants, here, core) for here, word, rest in rows]
    start = _expression(org, labels, constants, 0, core) % len(out) if org else 0
    return Warrior(tuple(out), start)


def _instruction(
    word: str, rest: str, labels: dict[str, int], constants: dict[str, int], here: int, core: int
) -> Instruction:
    op, _, mod = word.partition(".")
    op, mod = op.upper(), mod.upper()
    if op not in OPCODES:
        raise _Refused("unknown opcode")
    if mod and mod not in MODIFIERS:
        raise _Refused("unknown modifier")
    fields = [f for f in rest.split(",")] if rest.strip() else []
    if len(fields) > 2 or any(not f.strip() for f in fields):
        raise _Refused("bad operands")
    if not fields:
        raise _Refused("missing operand")
    if len(fields) == 1:
        if op == "DAT":  # ICWS'94: `DAT x` is `DAT #0, x`
            fields = ["#0", fields[0]]
        elif op in _ONE_OPERAND_B_ZERO:
            fields = [fields[0], "$0"]
        else:
            raise _Refused("missing operand")
    a_mode, a = _operand(fields[0], labels, constants, here, core)
    b_mode, b = _operand(fields[1], labels, constants, here, core)
    op = "SEQ" if op == "CMP" else op  # the same instruction in '94
    return Instruction(op, mod or default_modifier(op, a_mode, b_mode), a_mode, a, b_mode, b)


def parse(text: object, limits: RedcodeLimits = RedcodeLimits()) -> ParseResult:
    """Warrior text -> ParseResult; never raises."""
    try:
        return ParseResult(_parse(text, limits))  # type: ignore[arg-type]
    except _Refused as e:
        return ParseResult(None, str(e))
