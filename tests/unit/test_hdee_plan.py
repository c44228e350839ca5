"""HDEE plan: bad plans are refused before training, naming the expert and the field."""

import pytest

from decentrain.algorithms.hdee.plan import EnsemblePlan, LaneConfig, SeedConfig, run_name, validate

DOMAINS = ["general", "python", "c_headers", "licenses", "docs"]


def lanes(steps=(300, 400, 500), **overrides) -> list[LaneConfig]:
    domains = [["python", "docs"], ["c_headers", "docs"], ["licenses", "python"]]
    return [LaneConfig(domains=d, steps=[s, s], **overrides) for d, s in zip(domains, steps)]


def plan(**overrides) -> EnsemblePlan:
    kw = dict(seeds=[SeedConfig(name="seed-M", intermediate_size=3072)], tokens_per_step=4096)
    kw["lanes"] = lanes(seed="seed-M", intermediate_size=3072)
    return EnsemblePlan(**{**kw, **overrides})


def test_valid_plan_runs_and_names():
    p = plan()
    validate(p, DOMAINS)
    assert p.num_experts == 3
    runs = p.expert_runs()
    assert [r.name for r in runs] == [f"lane{i}-it{k}-M" for i in range(3) for k in range(2)]
    # each lane branches from the seed, then continues from its own previous checkpoint
    assert [(r.name, r.init_from) for r in runs[:2]] == [("lane0-it0-M", "seed-M"), ("lane0-it1-M", "lane0-it0-M")]
    assert [r.steps for r in runs] == [300, 300, 400, 400, 500, 500]
    assert p.final_experts() == ["lane0-it1-M", "lane1-it1-M", "lane2-it1-M"]
    assert run_name(2, 5, "L") == "lane2-it5-L"


def test_heterogeneous_sizes_need_one_seed_per_width():
    seeds = [SeedConfig(name=f"seed-{s}", size=s, intermediate_size=w) for s, w in [("S", 2304), ("L", 3840)]]
    ls = [
        LaneConfig(domains=["python"], steps=[10], size="S", intermediate_size=2304, seed="seed-S"),
        LaneConfig(domains=["docs"], steps=[10], size="L", intermediate_size=3840, seed="seed-L"),
    ]
    p = EnsemblePlan(seeds=seeds, lanes=ls, tokens_per_step=64)
    assert [r.name for r in p.expert_runs()] == ["lane0-it0-S", "lane1-it0-L"]
    ls[1].seed = "seed-S"
    with pytest.raises(ValueError, match=r"lanes\[1\] \(lane1\).intermediate_size=3840 differs from seed 'seed-S'"):
        EnsemblePlan(seeds=seeds, lanes=ls, tokens_per_step=64)


def test_unknown_domain_lists_allowed():
    p = plan()
    p.lanes[1].domains[1] = "poetry"
    with pytest.raises(ValueError, match=r"lanes\[1\] \(lane1\).domains\[1\]='poetry' is unknown; allowed: \["):
        validate(p, DOMAINS)
    with pytest.raises(ValueError, match=r"seeds\[0\] \('seed-M'\).domains\[0\]='general' is unknown"):
        validate(plan(), ["python", "docs", "c_headers", "licenses"])


def test_expert_without_steps():
    bad = lanes(seed="seed-M")
    bad[2].steps = []
    with pytest.raises(ValueError, match=r"lanes\[2\] \(lane2\).steps is empty"):
        plan(lanes=bad)


@pytest.mark.parametrize("steps", [0, -5])
def test_non_positive_steps(steps):
    bad = lanes(seed="seed-M")
    bad[1].steps = [100, steps]
    with pytest.raises(ValueError, match=rf"lanes\[1\] \(lane1\).steps\[1\]={steps} \(domain 'docs'\) must be > 0"):
        plan(lanes=bad)
    with pytest.raises(ValueError, match=rf"seeds\[0\] \('seed-M'\).steps={steps}"):
        plan(seeds=[SeedConfig(name="seed-M", steps=steps)])


def test_steps_must_match_domains():
    bad = lanes(seed="seed-M")
    bad[0].steps = [100]
    with pytest.raises(ValueError, match=r"lanes\[0\] \(lane0\).steps has 1 entries but .*domains has 2"):
        plan(lanes=bad)


def test_validate_catches_edits_after_construction():
    p = plan()
    p.lanes[0].steps[0] = 0
    with pytest.raises(ValueError, match=r"lanes\[0\] \(lane0\).steps\[0\]=0"):
        validate(p, DOMAINS)


def test_mixed_tokenizers_need_opt_in():
    seeds = [SeedConfig(name="a", tokenizer="byt5"), SeedConfig(name="b", tokenizer="qwen2")]
    ls = lanes(seed="a")
    ls[2].seed, ls[2].tokenizer = "b", "qwen2"
    mixed = r"lanes\[2\] \(lane2\).tokenizer='qwen2' differs from lanes\[0\].*per_expert_tokenization=True"
    with pytest.raises(ValueError, match=mixed):
        EnsemblePlan(seeds=seeds, lanes=ls, tokens_per_step=64)
    EnsemblePlan(seeds=seeds, lanes=ls, tokens_per_step=64, per_expert_tokenization=True)
    # a lane never changes tokenizer away from the seed it branches from
    ls[1].tokenizer = "qwen2"
    with pytest.raises(ValueError, match=r"lanes\[1\] \(lane1\).tokenizer='qwen2' differs from seed 'a'"):
        EnsemblePlan(seeds=seeds, lanes=ls, tokens_per_step=64, per_expert_tokenization=True)


def test_seed_references_and_names():
    with pytest.raises(ValueError, match=r"lanes\[0\] \(lane0\).seed='nope' is unknown; allowed: \['seed-M'\]"):
        plan(lanes=lanes(seed="nope"))
    with pytest.raises(ValueError, match=r"seeds\[1\] \('seed-M'\).name is used twice"):
        plan(seeds=[SeedConfig(name="seed-M"), SeedConfig(name="seed-M")])
    with pytest.raises(ValueError, match=r"run names \['lane0-it0-M'\] are not unique"):
        plan(seeds=[SeedConfig(name="seed-M"), SeedConfig(name="lane0-it0-M")])
    with pytest.raises(ValueError, match=r"lanes\[0\] \(lane0\).size='M/2'"):
        plan(lanes=lanes(seed="seed-M", size="M/2"))


def test_plan_level_fields():
    with pytest.raises(ValueError, match="plan.tokens_per_step=0"):
        plan(tokens_per_step=0)
    with pytest.raises(ValueError, match="plan.lanes is empty"):
        plan(lanes=[])
    with pytest.raises(ValueError, match="plan.seeds is empty"):
        plan(seeds=[])
