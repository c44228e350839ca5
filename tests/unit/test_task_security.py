"""Peer text reaches no interpreter: pure parsers score every vetted task; entries are rebuilt here."""

import ast
import os
import random
from pathlib import Path

import pytest
import reasoning_gym

import decentrain
from decentrain.tasks import (
    MAX_ANSWER_CHARS,
    EntryMismatch,
    EntryRef,
    Malformed,
    PromptTemplate,
    TaskMixConfig,
    TaskMixture,
    TemplateConfig,
    Verifier,
    task_config_id,
)
from decentrain.tasks.answers import parse_literal, parse_polynomial, score
from decentrain.tasks.vetted import VETTED_TASKS

# -- nothing in the library evaluates text --------------------------------------------------------

# Builtins called by name (model.eval() and re.compile() are not these), and evaluating functions by any path.
_EVALUATING_BUILTINS = {"eval", "exec", "compile", "__import__", "breakpoint"}
_EVALUATING_CALLS = {"literal_eval", "parse_expr", "sympify", "import_module", "score_answer", "run_path", "run_module"}
_EVALUATING_MODULES = {"sympy", "pickle", "marshal", "code", "codeop", "dill", "cloudpickle"}


TESTING_KIT = Path(decentrain.__file__).parent / "testing"  # test_layering: nothing in the library imports it


def _evaluating_call(f: ast.expr) -> str:
    if isinstance(f, ast.Name) and f.id in _EVALUATING_BUILTINS | _EVALUATING_CALLS:
        return f.id
    if isinstance(f, ast.Attribute) and (
        f.attr in _EVALUATING_CALLS
        or (f.attr in _EVALUATING_BUILTINS and isinstance(f.value, ast.Name) and f.value.id == "builtins")
    ):
        return f.attr
    return ""


# The one import by computed name: core/registry.discover imports a package's own modules, named by
# pkgutil from the package's directory (never from a config or a peer) so that entries register themselves.
_DISCOVERY = ("registry.py", "import_module")


def test_the_library_calls_no_interpreter():
    """No eval/exec/compile/sympy/literal_eval/pickle anywhere under decentrain/ (nor reasoning-gym's verifiers)."""
    found = []
    for path in Path(decentrain.__file__).parent.rglob("*.py"):
        if TESTING_KIT in path.parents:  # the test kit loads its own modules by name; the library never imports it
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call):
                name = _evaluating_call(node.func)
                if name and (path.name, name) != _DISCOVERY:
                    found.append(f"{path.name}:{node.lineno} calls {name}")
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + ([node.module] if isinstance(node, ast.ImportFrom) else [])
                for n in names:
                    if n and n.split(".")[0] in _EVALUATING_MODULES:
                        found.append(f"{path.name}:{node.lineno} imports {n}")
    assert found == []


def test_discovery_imports_only_the_package_s_own_module_names():
    """The exempt call: its argument is `package.<name>` with <name> from pkgutil.iter_modules of the package's path."""
    src = (Path(decentrain.__file__).parent / "core" / "registry.py").read_text()
    calls = [
        n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call) and _evaluating_call(n.func) == "import_module"
    ]
    assert len(calls) == 1 and ast.unparse(calls[0].args[0]) == "f'{package}.{name}'"
    assert "for info in pkgutil.iter_modules(list(path))" in src  # discover: the package's module list
    assert 'for path in sorted(root.rglob("*.py"))' in src  # discover_marked: the package's own files


def test_the_grep_catches_what_it_looks_for():
    tree = ast.parse(
        "x = eval(s)\nds.score_answer(a, e)\nbuiltins.exec(s)\nast.literal_eval(s)\nm.eval()\nre.compile(p)\n"
    )
    calls = [_evaluating_call(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)]
    assert sorted(filter(None, calls)) == ["eval", "exec", "literal_eval", "score_answer"]
    assert "sympy" in _EVALUATING_MODULES


# -- the pure scorers agree with reasoning-gym on well-formed answers ----------------------------


def _variants(entry: dict, task: str, rng: random.Random) -> list[str]:
    a = str(entry["answer"])
    out = [a, a + " ", " " + a, a[:-1], "", "x", a + a]
    md = entry["metadata"]
    if task == "string_insertion":
        out += [repr(list(a)), str(tuple(a)), repr(a), repr(list(a[:-1]))]
    elif task == "spiral_matrix":
        out += [str([int(x) for x in a.split()]), str(a.split()), "[1, [2]]"]
    elif task == "binary_matrix":
        out += [str(md["solution"]), str([[str(x) for x in r] for r in md["solution"]]), a.replace("\n", " ")]
    elif task == "polynomial_multiplication":
        terms = a.replace(" - ", " + -").split(" + ")
        rng.shuffle(terms)
        out += [" + ".join(terms), a.replace("*", "*1*", 1), a + " + 0", a + " + 1"]
    elif task == "number_sorting":
        out += [a.replace("'", ""), str(md["sorted_numbers"][::-1]), a.replace("'", '"')]
    elif task == "word_sorting":
        out += [", ".join(reversed(a.split(", "))), a.replace(", ", ",")]
    elif task == "chain_sum":
        out += ["+0" + a.lstrip("-"), a + ".00", "1," + a]
    return out


@pytest.mark.parametrize("task", VETTED_TASKS)
def test_pure_scorer_matches_reasoning_gym_on_well_formed_answers(task):
    # reasoning-gym's verifier runs here only on text this test wrote.
    ds = reasoning_gym.create_dataset(task, size=25, seed=5)
    rng = random.Random(0)
    checked = 0
    for i in range(len(ds)):
        entry = ds[i]
        for answer in _variants(entry, task, rng):
            try:
                mine = score(task, answer, entry)
            except Malformed:
                mine = 0.0
            assert mine == pytest.approx(float(ds.score_answer(answer, entry))), (task, answer)
            checked += 1
    assert checked >= 25 * 7


def test_number_sorting_refuses_nan_that_reasoning_gym_scores_1():
    ds = reasoning_gym.create_dataset("number_sorting", size=1, seed=0)
    entry = ds[0]
    nans = str(["nan"] * len(entry["metadata"]["sorted_numbers"]))
    assert ds.score_answer(nans, entry) == 1.0  # reasoning-gym's own verifier
    with pytest.raises(Malformed):
        score("number_sorting", nans, entry)
    with pytest.raises(Malformed):
        score("number_sorting", "[NaN, Infinity]", entry)


def test_parsers_are_strict_and_capped():
    assert parse_literal("[['a', 1], ('b',)]") == [["a", 1], ["b"]]
    for bad in ("[[[1]]]", "[1, 2", "['a\\'']", "[x]", "__import__('os')", "[1] + [2]", "{1: 2}", "[1,, 2]"):
        with pytest.raises(Malformed):
            parse_literal(bad)
    xs = frozenset({"x", "y"})
    assert parse_polynomial("2*x**2 - x*x + 3 - 3 + y*2*-1", xs) == {(("x", 2),): 1, (("y", 1),): -2}
    for bad in (
        "x^2",
        "(x + 1)**2",
        "x/2",
        "2.0*x",
        "z",
        "x**9999",
        "x ** y",
        "x +",
        "2 3",
        "9**9**9",
        "__import__('os')",
        "ilcm.__globals__",
        "9" * 70,
    ):
        with pytest.raises(Malformed):
            parse_polynomial(bad, xs)
    entry = {"answer": "a", "metadata": {}}
    with pytest.raises(Malformed):
        score("basic_arithmetic", "1" * (MAX_ANSWER_CHARS + 1), entry)
    deep = "[" * 2000 + "]" * 2000
    for task in VETTED_TASKS:
        item = TaskMixture(TaskMixConfig(tasks=[task], size=3))[0]
        e = {"question": item.question, "answer": item.answer, "metadata": item.metadata}
        for junk in (deep, "\x00" * 100, "'" * 3000, "1e999999999", "-" * 4000 + "x"):
            try:
                assert 0.0 <= score(task, junk, e) <= 1.0
            except Malformed:
                pass


def test_unvetted_tasks_are_refused_at_config_time():
    with pytest.raises(
        ValueError, match=r"tasks='composite' is not a vetted task \(no pure answer parser\); allowed: \[.*'chain_sum'"
    ):
        TaskMixConfig(tasks=["composite"])
    with pytest.raises(ValueError, match="twice"):
        TaskMixConfig(tasks=["chain_sum", "chain_sum"])
    with pytest.raises(ValueError, match="seed"):
        TaskMixConfig(seed=-1)
    v = Verifier(PromptTemplate(TemplateConfig()))
    item = TaskMixture(TaskMixConfig(tasks=["chain_sum"], size=5))[0]
    with pytest.raises(ValueError, match="not a vetted task"):
        v.scores(type(item)("composite", item.question, item.answer), ["1\n"])
    assert set(TaskMixConfig().tasks) <= set(VETTED_TASKS)


def test_malformed_answers_are_counted():
    v = Verifier(PromptTemplate(TemplateConfig()))
    item = TaskMixture(TaskMixConfig(tasks=["spiral_matrix"], size=5))[0]
    assert v.scores(item, ["[1, 2\n", item.answer + "\n", "garbage(\n"]) == [0.0, 1.0, 0.0]
    assert v.malformed == 2


# -- entries are rebuilt here ------------------------------------------------------------------

KW = {"chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}


def test_rebuild_matches_the_peer_entry_and_refuses_the_rest():
    mine = TaskMixture(TaskMixConfig(tasks=["basic_arithmetic", "chain_sum"], size=50, task_kwargs=KW))
    # The peer lists chain_sum first, so its dataset seed differs from ours: rebuilt all the same.
    peer = TaskMixture(TaskMixConfig(tasks=["chain_sum"], size=30, task_kwargs=KW))
    item = peer[3]
    assert item.ref.seed != mine.seeds["chain_sum"]
    assert mine.rebuild(item.ref, item.question) == item
    cases = {
        "question_mismatch": (item.ref, "What is 2 + 2?"),
        "task_not_in_mix": (EntryRef("string_insertion", "0" * 16, 0, 10, 1), "q"),
        "task_config_mismatch": (EntryRef("chain_sum", task_config_id("chain_sum", {}), 0, 50, 1), item.question),
        "entry_out_of_range": (EntryRef("chain_sum", item.ref.config, 0, 50, 50), item.question),
    }
    for reason, (ref, question) in cases.items():
        with pytest.raises(EntryMismatch) as e:
            mine.rebuild(ref, question)
        assert e.value.reason == reason
    # Peers' dataset seeds are cached, boundedly.
    for seed in range(70):
        ref = EntryRef("chain_sum", item.ref.config, seed, 30, 0)
        mine.rebuild(ref, peer._create("chain_sum", 30, seed)[0]["question"])
    assert len(mine._foreign) == 64


def test_task_config_id_is_order_independent_and_distinguishes_kwargs():
    assert task_config_id("chain_sum", {"a": 1, "b": 2}) == task_config_id("chain_sum", {"b": 2, "a": 1})
    assert task_config_id("chain_sum", {"a": 1}) != task_config_id("chain_sum", {"a": 2})
    assert task_config_id("chain_sum", {}) != task_config_id("basic_arithmetic", {})
    assert len(task_config_id("x", {})) == 16 and os.sep not in task_config_id("x", {})
