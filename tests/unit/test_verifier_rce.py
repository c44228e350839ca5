"""Verifiers that evaluate model text run it in the sandbox: hostile completions create no file.

Uses only the API the old code had too (Verifier(template)(item, completion)), so this test
fails on it: there, each of these tasks created files (5 of 5).
"""

import pytest

from decentrain.tasks import PromptTemplate, TaskMixConfig, TaskMixture, TemplateConfig, Verifier

EVAL_TASKS = ["string_insertion", "number_sorting", "polynomial_multiplication", "spiral_matrix", "binary_matrix"]


@pytest.fixture(scope="module")
def verifier():
    # Tag answers: binary_matrix's answer spans several lines.
    v = Verifier(PromptTemplate(TemplateConfig(prompt="{question}", answer_format="tag")))
    yield v
    if hasattr(v, "close"):
        v.close()


_OS = '[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == "_wrap_close"][0].__init__.__globals__'


def markers(path) -> list[str]:
    return [f'__import__("os").system("touch {path}_a")', f'open("{path}_b", "w")',
            f'[open("{path}_c", "w").close()]', f'[__import__("pathlib").Path("{path}_d").touch()]',
            '[open("rel_marker", "w")]', f'exec("open(\'{path}_e\', \'w\')")',
            # os reached without an import, and its functions that raise no audit event:
            f'[{_OS}["mkfifo"]("{path}_f")]', f'[{_OS}["system"]("touch {path}_g")]',
            f'[{_OS}["close"](2), {_OS}["open"]("{path}_h", 65)]']


@pytest.mark.parametrize("task", EVAL_TASKS)
def test_rce_markers_create_no_file(task, verifier, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    item = TaskMixture(TaskMixConfig(tasks=[task], size=20))[0]
    scores = [verifier(item, f"<answer>{c}</answer>") for c in markers(tmp_path / task)]
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert scores == [0.0] * len(scores)
    assert verifier(item, f"<answer>{item.answer}</answer>") == 1.0  # honest answers still score


def test_number_sorting_answer_field_runs_nowhere_here(verifier, tmp_path):
    # number_sorting evals its *answer* when that is not JSON; peers used to send the answer.
    # Now answers are rebuilt locally (peers cannot send one), and the verifier is sandboxed anyway.
    item = TaskMixture(TaskMixConfig(tasks=["number_sorting"], size=20))[0]
    hostile = type(item)("number_sorting", item.question, f'__import__("os").system("touch {tmp_path}/ns")',
                         item.metadata)
    assert verifier(hostile, "<answer>[1, 2]</answer>") == 0.0
    assert list(tmp_path.iterdir()) == []
