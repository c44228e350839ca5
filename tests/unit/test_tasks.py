import json

import numpy as np
import pytest

from decentrain.tasks import (
    PromptTemplate,
    RewardConfig,
    TaskItem,
    TaskMixConfig,
    TaskMixture,
    TemplateConfig,
    Verifier,
)
from decentrain.tasks.mixture import json_safe


def small_mix(**kw) -> TaskMixture:
    return TaskMixture(TaskMixConfig(tasks=["basic_arithmetic", "leg_counting"], size=50, seed=3, **kw))


def test_unknown_task_names_field_and_allowed():
    with pytest.raises(ValueError, match=r"tasks='no_such_task' is unknown; allowed: \[.*'basic_arithmetic'"):
        TaskMixConfig(tasks=["no_such_task"])


@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(tasks=[]), "tasks"),
        (dict(weights=[1.0]), "weights"),
        (dict(weights=[0.0, 0.0, 0.0]), "weights"),
        (dict(size=0), "size"),
        (dict(task_kwargs={"chain_sum_x": {}}), "task_kwargs"),
    ],
)
def test_bad_config_names_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        TaskMixConfig(**kw)


def test_mixture_is_deterministic_and_json_safe():
    a, b = small_mix(), small_mix()
    items = [a[i] for i in range(20)]
    assert items == [b[i] for i in range(20)]
    assert {it.task for it in items} == {"basic_arithmetic", "leg_counting"}
    for it in items:
        assert isinstance(it, TaskItem) and isinstance(it.answer, str)
        assert "difficulty" not in it.metadata
        assert json.loads(json.dumps(it.metadata)) == it.metadata  # plain JSON, round-trips


def test_weights_pick_tasks():
    mix = small_mix(weights=[0.0, 1.0])
    assert {mix[i].task for i in range(30)} == {"leg_counting"}


def test_task_kwargs_reach_reasoning_gym():
    cfg = TaskMixConfig(tasks=["chain_sum"], size=20, task_kwargs={"chain_sum": {"min_terms": 2, "max_terms": 2}})
    mix = TaskMixture(cfg)
    assert all(mix[i].metadata["num_terms"] == 2 for i in range(10))


def test_sample_uses_the_given_rng():
    mix = small_mix()
    assert mix.sample(5, np.random.default_rng(0)) == mix.sample(5, np.random.default_rng(0))


def test_json_safe_converts_non_json_types():
    assert json_safe({"t": (1, 2), "s": {3}, "n": np.int64(4), "f": float("nan"), "o": object()}) == {
        "t": [1, 2],
        "s": [3],
        "n": 4,
        "f": None,
        "o": None,
    }


def test_template_and_extraction():
    t = PromptTemplate(TemplateConfig())
    assert t("What is {x}?") == "Q: What is {x}?\nA: "
    assert t.extract_answer(" 42\nQ: more") == "42"
    assert t.extract_answer("\n") is None
    assert t.is_well_formed("42\n") and not t.is_well_formed("42")
    tag = PromptTemplate(TemplateConfig(prompt="{question}", answer_format="tag"))
    assert tag.extract_answer("think <answer> 7 </answer>") == "7"
    assert tag.extract_answer("7") is None


def test_template_config_validation():
    with pytest.raises(ValueError, match="prompt"):
        TemplateConfig(prompt="no placeholder")
    with pytest.raises(ValueError, match=r"answer_format='xml' is unknown; allowed: \['line', 'tag'\]"):
        TemplateConfig(answer_format="xml")
    with pytest.raises(ValueError, match="format_weight"):
        RewardConfig(format_weight=-1)


def test_verifier_rewards():
    item = small_mix()[0]
    v = Verifier(PromptTemplate(TemplateConfig()))
    assert v(item, item.answer + "\n") == 1.0
    assert v(item, "garbage") == 0.0
    fmt = Verifier(PromptTemplate(TemplateConfig()), RewardConfig(format_weight=0.5))
    assert fmt(item, item.answer + "\n") == 1.5
    assert fmt(item, "wrong\n") == 0.5
    assert fmt(item, "") == 0.0


def test_exact_reward_gives_no_partial_credit():
    # basic_arithmetic scores "16" for "6" 0.5 (substring credit); the default `exact` reward gives 0.
    item = TaskItem(task="basic_arithmetic", question="Calculate 1 + 5.", answer="6", metadata={})
    template = PromptTemplate(TemplateConfig())
    assert Verifier(template).scores(item, ["16\n"]) == [0.5]
    assert Verifier(template).rewards(item, ["16\n", "6\n"]) == [0.0, 1.0]
    assert Verifier(template, RewardConfig(kind="verifier")).rewards(item, ["16\n", "6\n"]) == [0.5, 1.0]
    with pytest.raises(ValueError, match=r"reward.kind='soft' is unknown; allowed: \['exact', 'verifier'\]"):
        RewardConfig(kind="soft")


def test_verifier_scores_tasks_outside_the_mix_and_rejects_unknown():
    v = Verifier(PromptTemplate(TemplateConfig()))
    item = TaskItem(task="chain_sum", question="1 + 2 =", answer="3", metadata={})
    assert v(item, "3\n") == 1.0
    with pytest.raises(ValueError, match="task='nope' is unknown"):
        v(TaskItem(task="nope", question="q", answer="a"), "a")
