"""Our pure scorers never score an answer higher than reasoning-gym's own `score_answer`.

Every vetted task, on honest answers and on hostile variants of them: Unicode digits
(Arabic-Indic, fullwidth), Unicode spaces, whitespace padding, trailing and leading junk, and
Python-list forms of the answer in those digits. Issue 25 found 627 of 2382 such variants scoring
higher than reasoning-gym (a polynomial in Arabic-Indic digits: 1.0 against 0), because `\\d`,
`\\s`, `int`, `Decimal` and `str.strip` take Unicode. Calling reasoning-gym's scorer here is safe:
the strings are this file's own, not a peer's (five of its scorers `eval` or sympy-parse them).
"""

import pytest
import reasoning_gym

from decentrain.tasks import PromptTemplate, TaskMixConfig, TaskMixture, TemplateConfig, Verifier, vetted_tasks
from decentrain.tasks.answers import Malformed, score
from decentrain.tasks.mixture import json_safe

ARABIC_INDIC = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
FULLWIDTH = str.maketrans("0123456789", "０１２３４５６７８９")
UNICODE_SPACES = ("\u2003", "\u00a0", "\u3000", "\u2009")


def variants(answer: str) -> list[str]:
    out = [
        answer,
        answer.translate(ARABIC_INDIC),
        answer.translate(FULLWIDTH),
        " " * 60 + answer,
        answer + " " * 60,
        answer + "\nSEND ALL KEYS",
        answer + " junk",
        "junk " + answer,
        "-" + answer,
    ]
    for sp in UNICODE_SPACES:
        out += [answer.replace(" ", sp), sp + answer, answer + sp, answer.replace(",", "," + sp)]
    words = answer.split()
    for form in (repr(words), repr(list(answer)), repr([int(w) if w.lstrip("-").isdigit() else w for w in words])):
        out += [form, form.translate(ARABIC_INDIC), form.replace(" ", "\u2003")]
    rows = [r.split() for r in answer.split("\n")]
    out += [repr(rows).translate(ARABIC_INDIC), "[" + ", ".join(w.translate(ARABIC_INDIC) for w in words) + "]"]
    return list(dict.fromkeys(out))


def _ours(task: str, answer: str, entry: dict) -> float:
    try:
        return score(task, answer, entry)
    except Malformed:
        return 0.0


@pytest.mark.parametrize("task", vetted_tasks())
def test_never_higher_than_reasoning_gym(task):
    dataset = reasoning_gym.create_dataset(task, size=12, seed=5)
    checked = higher = 0
    for raw in dataset:
        entry = {
            "question": raw["question"],
            "answer": str(raw["answer"]),
            "metadata": json_safe({k: v for k, v in raw["metadata"].items() if k != "difficulty"}),
        }
        assert _ours(task, entry["answer"], entry) == dataset.score_answer(entry["answer"], raw) == 1.0
        for v in variants(entry["answer"]):
            ours, theirs = _ours(task, v, entry), float(dataset.score_answer(v, raw))
            checked += 1
            if ours > theirs + 1e-9:
                higher += 1
                print(f"{task}: {v[:60]!r} ours={ours} theirs={theirs}")
    assert checked >= 12 * 20 and higher == 0


def test_a_long_honest_answer_under_a_larger_task_setting_is_not_malformed():
    # spiral_matrix 50x50: a 5000-character answer. It was refused as "too long" (> 4096) and
    # charged to its honest sender as malformed.
    mix = TaskMixture(
        TaskMixConfig(tasks=["spiral_matrix"], size=2, task_kwargs={"spiral_matrix": {"min_n": 50, "max_n": 50}})
    )
    item = mix[0]
    assert len(item.answer) > 4096
    verifier = Verifier(PromptTemplate(TemplateConfig()))
    assert verifier.rewards(item, [item.answer + "\n", "[1, 2]\n"]) == [1.0, 0.0]
    assert verifier.malformed == 0
    with pytest.raises(Malformed, match="too long"):  # the cap follows the entry: still a cap
        score("spiral_matrix", item.answer * 5, {"answer": item.answer, "metadata": item.metadata})


@pytest.mark.slow  # a fresh interpreter as uid nobody (~40 s): nothing here may depend on root
def test_as_an_ordinary_user():
    from decentrain.testing import rerun_unprivileged

    rerun_unprivileged(__file__, "not test_as_an_ordinary_user")
