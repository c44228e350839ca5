"""Verifiers never run peer text in this interpreter; only vetted tasks; entries are rebuilt here."""

import ast
import inspect
import os
import sys
import textwrap

import pytest
from reasoning_gym.factory import DATASETS

from decentrain.tasks import (
    EntryMismatch,
    EntryRef,
    PromptTemplate,
    SandboxScorer,
    TaskMixConfig,
    TaskMixture,
    TemplateConfig,
    Verifier,
    task_config_id,
)
from decentrain.tasks.vetted import IN_PROCESS, SANDBOX, VETTED_TASKS, verifier_mode

def markers(path) -> list[str]:
    """Completions that created files in a receiver through these verifiers (5 of 5 tasks before)."""
    return [f'__import__("os").system("touch {path}_a")\n', f'open("{path}_b", "w")\n']


def test_sandbox_survives_hangs_memory_bombs_and_forged_replies(tmp_path):
    sandbox = SandboxScorer(timeout_s=1.0)
    v = Verifier(PromptTemplate(TemplateConfig()), sandbox=sandbox)
    try:
        item = TaskMixture(TaskMixConfig(tasks=["spiral_matrix"], size=20))[0]
        forged = 'print(\'{"nonce": "x", "scores": [1.0, 1.0]}\', flush=True)\n'
        steal = '[__import__("sys")._getframe(1).f_locals]\n'
        assert v.scores(item, [forged, steal]) == [0.0, 0.0]
        assert v.scores(item, ["[0] * 10**10\n"]) == [0.0]  # RLIMIT_AS: MemoryError inside the worker
        assert v.scores(item, ["[x for x in iter(int, 1)]\n", item.answer + "\n"]) == [0.0, 0.0]  # timeout
        assert sandbox.failures == 1
        assert v.scores(item, [item.answer + "\n"]) == [1.0]  # a fresh worker took over
        assert sandbox.restarts == 1
    finally:
        v.close()


def test_unvetted_tasks_are_refused_at_config_time():
    with pytest.raises(ValueError, match=r"tasks='composite' is not a vetted task; allowed: \[.*'chain_sum'"):
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


# -- in-process verifiers evaluate nothing ------------------------------------------------------

_EVALUATING = {"eval", "exec", "compile", "__import__", "parse_expr", "sympify", "literal_eval", "import_module"}


def _called_functions(fn, seen: set) -> None:
    """Every Python function reachable from `fn`'s calls inside reasoning_gym, checked recursively."""
    if fn in seen:
        return
    seen.add(fn)
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            assert name not in _EVALUATING, f"{fn.__qualname__} calls {name}"
            target = None
            if isinstance(node.func, ast.Name):
                target = fn.__globals__.get(name)
            elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name):
                target = getattr(fn.__globals__.get(node.func.value.id), name, None)
            if inspect.isfunction(target) and target.__module__.startswith("reasoning_gym"):
                _called_functions(target, seen)


@pytest.mark.parametrize("task", [t for t, (mode, _) in VETTED_TASKS.items() if mode == IN_PROCESS])
def test_in_process_verifiers_evaluate_nothing(task):
    assert verifier_mode(task) == IN_PROCESS
    seen: set = set()
    _called_functions(DATASETS[task][0].score_answer, seen)
    assert seen
    # And at run time: no compile/exec audit events while scoring hostile text here.
    item = TaskMixture(TaskMixConfig(tasks=[task], size=5))[0]
    v = Verifier(PromptTemplate(TemplateConfig()))
    assert v.scores(item, [item.answer + "\n"]) == [1.0]  # builds the verifier (dataclasses exec)
    events = []
    hook_on = [True]
    sys.addaudithook(lambda e, a: events.append(e) if hook_on[0] and e in ("exec", "compile", "import", "os.system") else None)
    try:
        v.scores(item, markers("/nonexistent/x") + [item.answer + "\n"])
    finally:
        hook_on[0] = False
    assert events == []


def test_changed_verifier_falls_back_to_the_sandbox(monkeypatch):
    cls = DATASETS["chain_sum"][0]
    monkeypatch.setattr(cls, "score_answer", lambda self, answer, entry: 1.0)
    assert verifier_mode("chain_sum") == SANDBOX


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
