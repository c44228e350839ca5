"""HDEE config: bad plans fail before any training, naming the expert and the field."""

import sys

import pytest
from omegaconf import OmegaConf

from decentrain.algorithms.hdee.config import (
    EvalConfig,
    JobConfig,
    check_plan,
    hdee_config_from_dict,
    load_saved_config,
    save_config,
)
from decentrain.algorithms.hdee.jobs import Job, child_jobs, run_jobs
from decentrain.testing import tiny_hdee_config


def test_tiny_plan_is_within_budget(tmp_path):
    assert check_plan(tiny_hdee_config(tmp_path)) == pytest.approx(0.0)  # S+M+L widths 48/64/80 average to M


def test_unknown_domain_names_the_expert(tmp_path):
    cfg = tiny_hdee_config(tmp_path)
    cfg.plan.lanes[1].domains = ["klingon"]
    with pytest.raises(ValueError, match=r"lanes\[1\] \(lane1\)\.domains\[0\]='klingon' is unknown"):
        check_plan(cfg)


def test_expert_with_no_steps_names_the_expert(tmp_path):
    raw = OmegaConf.to_container(OmegaConf.structured(tiny_hdee_config(tmp_path)))
    raw["plan"]["lanes"][2]["steps"] = []
    with pytest.raises(ValueError, match=r"lanes\[2\] \(lane2\)\.steps is empty"):
        hdee_config_from_dict(raw)


def test_plan_over_budget_shows_the_numbers(tmp_path):
    cfg = tiny_hdee_config(tmp_path)
    cfg.plan.lanes[2].steps = [4]
    with pytest.raises(ValueError, match=r"(?s)off the homogeneous baseline.*lane2 \(w80\): N=.*baseline:"):
        check_plan(cfg)


def test_tokens_per_step_must_match_the_batch(tmp_path):
    raw = OmegaConf.to_container(OmegaConf.structured(tiny_hdee_config(tmp_path)))
    raw["train"]["global_batch_size"] = 8
    with pytest.raises(ValueError, match=r"plan.tokens_per_step=128 must equal train.global_batch_size x data.seq_len"):
        hdee_config_from_dict(raw)


@pytest.mark.parametrize(
    "bad, match",
    [
        (lambda: EvalConfig(split="dev"), "eval.split='dev' is unknown"),
        (lambda: EvalConfig(weightings=["median"]), "eval.weightings='median' is unknown"),
        (lambda: JobConfig(stage="lane"), "job.index=None must name a lane"),
        (lambda: JobConfig(algorithm={"name": "nope"}), "job.algorithm.name='nope' is unknown"),
    ],
)
def test_field_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()


def test_saved_config_round_trips_with_overrides(tmp_path):
    cfg = tiny_hdee_config(tmp_path)
    save_config(tmp_path, OmegaConf.to_container(OmegaConf.structured(cfg)))
    back = load_saved_config(tmp_path, ["eval.top_k=2"])
    assert back.plan == cfg.plan and back.eval.top_k == 2
    assert load_saved_config(tmp_path / "nowhere") is None


def test_child_jobs_replace_the_job_keys(tmp_path):
    jobs = child_jobs(
        tiny_hdee_config(tmp_path),
        "lane",
        ["job.stage=all", "train.seed=3", f"ensemble_dir={tmp_path}"],
        "recipes.hdee_train",
    )
    assert [j.name for j in jobs] == ["lane0", "lane1", "lane2"]
    tail = jobs[1].argv[4:]
    assert tail[:2] == ["train.seed=3", "job.stage=lane"] and "job.index=1" in tail
    assert sum(a.startswith("job.stage=") for a in tail) == 1
    (tmp_path / "lane1-it0-w64" / "model").mkdir(parents=True)  # lane 1 already finished: no job
    assert [j.name for j in child_jobs(tiny_hdee_config(tmp_path), "lane", [], "m")] == ["lane0", "lane2"]


def test_run_jobs_runs_in_parallel_and_names_failures(tmp_path):
    # each job marks itself started and waits until all three have: only jobs that run at once all end
    # well (in a row, the first would wait alone and fail); no wall-clock bound, so a loaded box cannot fail it
    together = (
        "import pathlib, sys, time; d = pathlib.Path(sys.argv[1]); (d / sys.argv[2]).touch(); "
        "end = time.monotonic() + 120\n"
        "while len(list(d.glob('started-*'))) < 3:\n"
        "    if time.monotonic() > end: sys.exit('ran alone: the other jobs never started')\n"
        "    time.sleep(0.02)"
    )
    (tmp_path / "marks").mkdir()
    jobs = [
        Job(
            f"ok{i}", [sys.executable, "-c", together, str(tmp_path / "marks"), f"started-{i}"], tmp_path / f"ok{i}.log"
        )
        for i in range(3)
    ]
    run_jobs(jobs, max_parallel=3, poll_s=0.05)
    bad = Job("lane7", [sys.executable, "-c", "raise SystemExit('boom in lane7')"], tmp_path / "bad.log")
    with pytest.raises(RuntimeError, match=r"(?s)1 of 2 jobs failed: \['lane7'\].*boom in lane7"):
        run_jobs([jobs[0], bad], max_parallel=2, poll_s=0.05)


def test_job_algorithm_and_engine_are_whole_typed_sections(tmp_path):
    import dataclasses

    from decentrain.algorithms.noloco import NoLoCoConfig
    from decentrain.algorithms.pretraining.engines import EngineConfig

    def with_job(**job):
        return dataclasses.replace(tiny_hdee_config(tmp_path), job=JobConfig(**job))

    cfg = with_job(
        algorithm={"name": "noloco", "inner_steps": 3, "outer_optimizer": {"name": "noloco", "lr": 0.5}},
        engine=EngineConfig(name="torch"),
    )
    assert isinstance(cfg.job.algorithm, NoLoCoConfig) and cfg.job.algorithm.inner_steps == 3
    assert cfg.job.algorithm.outer_optimizer.lr == 0.5
    assert with_job(algorithm={"name": "noloco"}).job.algorithm == NoLoCoConfig()  # that algorithm's defaults
    with pytest.raises(ValueError, match=r"^job.algorithm.inner_steps=0 \(H\) must be >= 1$"):
        with_job(algorithm={"name": "noloco", "inner_steps": 0})
    with pytest.raises(ValueError, match=r"^job.algorithm: unknown field\(s\) \['bogus'\]"):
        with_job(algorithm={"name": "diloco", "bogus": 1})
    with pytest.raises(
        ValueError, match=r"^job.expert_algorithm was removed; use job.algorithm.name$"
    ):  # the older key
        hdee_config_from_dict({"job": {"expert_algorithm": "noloco"}})
    odd = dataclasses.replace(
        with_job(algorithm={"name": "noloco"}),
        launcher=dataclasses.replace(tiny_hdee_config(tmp_path).launcher, nproc_per_node=3),
    )
    with pytest.raises(ValueError, match="world size 3 is odd"):
        check_plan(odd)  # before any worker starts


def test_job_engine_is_typed_by_the_engine_s_own_config_class(tmp_path):
    pytest.importorskip("deepspeed")  # its config refuses to validate without the package
    raw = OmegaConf.to_container(OmegaConf.structured(tiny_hdee_config(tmp_path)))
    deepspeed = hdee_config_from_dict({**raw, "job": {"engine": {"name": "deepspeed", "zero_stage": 1}}})
    assert type(deepspeed.job.engine).__name__ == "DeepSpeedConfig" and deepspeed.job.engine.zero_stage == 1
    with pytest.raises(ValueError, match=r"^job.engine: unknown field\(s\) \['zero_stage'\]"):
        hdee_config_from_dict({**raw, "job": {"engine": {"name": "torch", "zero_stage": 1}}})
