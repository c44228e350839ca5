"""The strict Redcode parser: what it accepts means what pMARS means by it, and nothing else gets through."""

from __future__ import annotations

import re
import string
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from decentrain.algorithms.dei.redcode import Instruction, RedcodeLimits, default_modifier, parse
from decentrain.algorithms.dei.sft import shipped_warriors

CANONICAL_LINE = re.compile(r"[A-Z]{3}\.(A|B|AB|BA|F|X|I) [#$@<>*{}]\d+, [#$@<>*{}]\d+", re.ASCII)


def test_every_shipped_warrior_parses_and_its_rendering_is_a_fixed_point():
    warriors = shipped_warriors()
    assert set(warriors) >= {"imp", "dwarf", "paper", "stone", "scanner", "gate"}
    for name, w in warriors.items():
        again = parse(w.render()).warrior
        assert again == w, name


def test_labels_equ_org_and_relative_addresses():
    text = """
    ; a comment line
    step    EQU 4
            ORG start
    bomb    DAT #0
    start:  ADD #step, bomb
            MOV bomb, @bomb
            JMP start
            END
    """
    w = parse(text).warrior
    assert w.start == 1
    assert w.instructions == (
        Instruction("DAT", "F", "#", 0, "#", 0),  # `DAT x` is `DAT #0, x`
        Instruction("ADD", "AB", "#", 4, "$", 7999),  # bomb is one cell back: -1 mod 8000
        Instruction("MOV", "I", "$", 7998, "@", 7998),
        Instruction("JMP", "B", "$", 7998, "$", 0),  # `JMP x` is `JMP x, $0`
    )


@pytest.mark.parametrize(
    "op,a,b,expected",
    [
        ("DAT", "#", "#", "F"),
        ("NOP", "$", "$", "F"),
        ("MOV", "#", "$", "AB"),
        ("MOV", "$", "#", "B"),
        ("MOV", "$", "$", "I"),
        ("SEQ", "@", "$", "I"),
        ("ADD", "#", "$", "AB"),
        ("SUB", "$", "#", "B"),
        ("MUL", "$", "@", "F"),
        ("SLT", "#", "$", "AB"),
        ("SLT", "$", "#", "B"),
        ("JMP", "#", "$", "B"),
        ("SPL", "$", "$", "B"),
        ("DJN", "$", "#", "B"),
    ],
)
def test_default_modifiers_follow_the_icws94_draft(op, a, b, expected):
    # the same table pMARS applies (its `-r 0` listing of these lines shows these modifiers)
    assert default_modifier(op, a, b) == expected


def test_a_fenced_answer_is_read_from_its_block_only():
    answer = "Here is my warrior:\n```redcode\nMOV 0, 1\n```\nrm -rf / ; `touch /tmp/x`"
    assert parse(answer).warrior.render().count("MOV.I $0, $1") == 1


@pytest.mark.parametrize(
    "text,reason",
    [
        ("", "no instructions"),
        ("x" * 16_001, "too long"),
        ("\n".join(["MOV 0, 1"] * 101), "too many instructions"),
        ("\n".join([";c"] * 10) + "\n" + "\n".join(["  "] * 500), "no instructions"),
        ("MOV 0, 1234567890", "missing operator"),  # a number is at most 9 digits: int() never sees more
        ("FOR 3\nMOV 0, 1\nROF", "unknown opcode"),  # pMARS's preprocessor is not accepted
        ("LDP 0, 1", "unknown opcode"),  # p-space is not in the accepted set
        ("MOV.Q 0, 1", "unknown modifier"),
        ("MOV 0", "missing operand"),
        ("MOV 0, 1, 2", "bad operands"),
        ("JMP nowhere", "unknown label"),
        ("a MOV 0, 1\na DAT 0", "label defined twice"),
        ("MOV 0, 1 +", "dangling operator"),
        ("MOV 0, 1 2", "missing operator"),
        ("MOV %0, 1", "bad operand"),
        ("MOV CORESIZE, 1", "unknown label"),  # no predefined constants
    ],
)
def test_refusals_name_a_reason(text, reason):
    result = parse(text)
    assert result.warrior is None and result.error == reason


def test_limits_apply_before_work():
    text = "MOV 0, 1\n" * 2_000_000  # 18 MB: refused on its length alone
    t = time.process_time()  # CPU time, so a loaded box does not count; parsing 2M lines would take seconds of it
    assert parse(text).error == "too long"
    assert time.process_time() - t < 1.0
    assert parse("MOV 0, 1\n" * 50, RedcodeLimits(max_instructions=10)).error == "too many instructions"


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.text(max_size=400),
        st.text(alphabet=string.printable, max_size=400),
        st.lists(
            st.sampled_from(
                [
                    "MOV",
                    "DAT",
                    "spl",
                    "jmp",
                    "#",
                    "$",
                    "@",
                    "<",
                    "}",
                    "{",
                    ">",
                    "*",
                    ",",
                    ".AB",
                    ".I",
                    "x:",
                    "lbl",
                    "EQU",
                    "ORG",
                    "END",
                    "-",
                    "+",
                    "7",
                    "8000",
                    "\n",
                    " ",
                    ";",
                    "```",
                ]
            ),
            max_size=60,
        ).map("".join),
    )
)
def test_parse_is_total_and_what_it_renders_is_canonical(text):
    result = parse(text)  # never raises
    if result.warrior is not None:
        lines = result.warrior.render().splitlines()
        assert lines[:3] == [";redcode-94", ";name w", ";assert 1"] and lines[-1] == "END"
        assert all(CANONICAL_LINE.fullmatch(ln) for ln in lines[4:-1])
        assert all(0 <= i.a < 8000 and 0 <= i.b < 8000 for i in result.warrior.instructions)


@pytest.mark.slow  # a fresh interpreter as uid nobody: nothing here may depend on root
def test_as_an_ordinary_user():
    from decentrain.testing import rerun_unprivileged

    rerun_unprivileged(__file__, "not test_as_an_ordinary_user")
