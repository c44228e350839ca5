"""benchmarks/gpu_evidence.py on CPU: the ledger key, the budget, the arms' configs, and --smoke's whole path."""

import json
import math
import shutil

import pytest
import torch

import benchmarks.gpu_efficiency as eff
import benchmarks.gpu_evidence as ge
from benchmarks.ledger import Ledger


def cfg(**kw):
    return ge.EvidenceConfig(**kw)


PRESET = ge.load_preset(ge.PRESET)
CORPUS_ID = {"name": "pinned", "hash": "h"}
CPU = torch.device("cpu")
BATCH = eff.Batch(workers=4, global_batch=64, micro_batch=16)


def test_the_key_moves_with_what_is_computed_and_not_with_how_fast():
    base = ge.ledger_key(cfg(), PRESET, CORPUS_ID, CPU)
    for speed in (
        {"compile": "blocks"},
        {"log_every": 10},
        {"budget_s": 100.0},
        {"efficiency": "default"},
        {"seeds": 5},
    ):
        assert ge.ledger_key(cfg(**speed), PRESET, CORPUS_ID, CPU) == base, speed
    for setting in (
        {"steps": 800},
        {"global_batch": 128},
        {"seq_len": 256},
        {"data": "offline"},
        {"precision": "bf16"},
    ):
        assert ge.ledger_key(cfg(**setting), PRESET, CORPUS_ID, CPU)["protocol"] != base["protocol"], setting
    tuned = {**PRESET, "arms": {**PRESET["arms"], "noloco": ["algorithm=noloco", "algorithm.inner_steps=25"]}}
    assert ge.ledger_key(cfg(), tuned, CORPUS_ID, CPU)["protocol"] != base["protocol"]
    assert ge.ledger_key(cfg(), PRESET, {"name": "pinned", "hash": "other"}, CPU)["corpus"] != base["corpus"]
    assert base["gpu"] == "cpu" and base["numerics"]["torch"] == torch.__version__.split("+")[0]


def test_numerics_follow_the_arms_golden_trajectories(tmp_path):
    golden = tmp_path / "golden"
    shutil.copytree(ge.GOLDEN, golden)
    before = ge.numerics_digest(PRESET, golden)
    assert before == ge.numerics_digest(PRESET)
    (golden / "sapo_silo.json").write_text("{}")  # not an arm's algorithm: the key stays
    assert ge.numerics_digest(PRESET, golden) == before
    path = golden / "noloco_rank0.json"
    path.write_text(path.read_text().replace("0", "1", 1))  # an algorithm's numbers moved: regenerated goldens
    assert ge.numerics_digest(PRESET, golden) != before


def test_corpus_identity_is_the_pinned_hash_or_that_of_the_blocks():
    from decentrain.data.blocks import Corpus

    def corpus(x, name="offline", digest=None):
        return Corpus(
            {"d": {s: torch.full((4, 8), x, dtype=torch.long) for s in ("train", "val", "test")}}, name, digest
        )

    a, b = ge.corpus_identity("offline", corpus(5)), ge.corpus_identity("offline", corpus(6))
    assert a["hash"].startswith("blocks:") and a != b and a == ge.corpus_identity("offline", corpus(5))
    assert ge.corpus_identity("pinned", corpus(5, "pinned", "abc123")) == {"name": "pinned", "hash": "abc123"}


def test_every_arm_composes_to_the_recipe_config_it_names():
    for arm in PRESET["arms"]:
        tc, raw = ge.compose(ge.arm_overrides(cfg(data="offline"), PRESET, arm, 3, "/tmp/x"))
        assert tc.algorithm.name == ge.algorithm_of(PRESET, arm) and tc.train.seed == 3
        assert (tc.model.hidden_size, tc.model.num_layers, tc.train.global_batch_size, tc.data.seq_len) == (
            512,
            8,
            64,
            512,
        )
        assert tc.logger.all_ranks and not tc.resume and tc.train.eval_every == tc.train.steps == 400
    smoke = ge.compose(ge.arm_overrides(cfg(data="offline", smoke=True), PRESET, "noloco", 0, "/tmp/x"))[0]
    assert smoke.algorithm.inner_steps == 2 and smoke.model.hidden_size == 32 and smoke.train.device == "cpu"
    assert eff.merged(["a=1", "b=2"], ["a=3"]) == ["a=3", "b=2"]


def test_a_preset_that_cannot_run_fails_in_one_line(tmp_path):
    bad = tmp_path / "p.yaml"
    text = ge.PRESET.read_text()
    bad.write_text(text.replace("contender: noloco, baseline: diloco", "contender: noloco, baseline: streaming"))
    with pytest.raises(ValueError, match="names an arm the preset does not run"):
        ge.load_preset(bad)
    bad.write_text(text.replace("ddp: [algorithm=ddp]", "ddp: [train.seed=1]"))
    with pytest.raises(ValueError, match="arm ddp names no algorithm"):
        ge.load_preset(bad)
    with pytest.raises(ValueError, match="multiple of --workers x --micro-batch"):
        cfg(global_batch=40)


def test_a_run_that_would_overrun_the_budget_is_skipped_and_finished_arms_still_pair(monkeypatch):
    clock = {"t": 0.0}
    walls = {"ddp": 30.0, "diloco": 50.0, "noloco": 50.0, "sparseloco": 40.0}

    def fake_run(c, preset, arm, seed, corpus, device):
        clock["t"] += walls[arm]
        return {
            "arm": arm,
            "seed": seed,
            "bpb": 1.0,
            "bpb_by_domain": {},
            "bytes_sent_per_worker": 1.0,
            "tokens_per_s": None,
            "mfu": None,
            "wall_s": walls[arm],
            "train_s": walls[arm],
        }

    monkeypatch.setattr(ge, "run_arm", fake_run)
    budget = ge.Budget(290.0, clock=lambda: clock["t"])
    records, runs, skipped = ge.run_seeds(cfg(), PRESET, [4, 5], None, CPU, budget)
    # seed 4 takes 170 s; of the 120 s left ddp (30) and diloco (50) fit, noloco's 50 then does not,
    # sparseloco's 40 still does: seed 5 pairs sparseloco with diloco, but has no noloco
    assert [(r["seed"], sorted(r["arms"])) for r in records] == [
        (4, sorted(walls)),
        (5, ["ddp", "diloco", "sparseloco"]),
    ]
    assert len(runs) == 7 and [s.split(":")[0] for s in skipped] == ["seed 5 noloco"]


def test_variants_change_only_execution_compile_and_batch():
    base = ge.arm_overrides(cfg(), PRESET, "noloco", 0, "/tmp/x", steps=40)
    threads = eff.variant_overrides(base, "threads_blocks", BATCH)
    assert {
        "transport=inprocess",
        "transport.replicas=4",
        "launcher.nproc_per_node=1",
        "train.compile=blocks",
        "train.steps=40",
    } <= set(threads)
    procs = eff.variant_overrides(base, "processes_eager", BATCH)
    assert "launcher.nproc_per_node=4" in procs and not any(o.startswith("transport") for o in procs)
    double = eff.variant_overrides(base, "threads_eager_mb2x", BATCH)
    assert {"train.global_batch_size=128", "train.micro_batch_size=32"} <= set(double)
    for name in eff.VARIANTS:  # each is a command line the recipe accepts
        tc, _ = ge.compose(
            eff.variant_overrides(ge.arm_overrides(cfg(data="offline"), PRESET, "noloco", 0, "/tmp/x", 40), name, BATCH)
        )
        assert tc.train.steps == 40


def test_mps_is_only_used_where_the_box_has_it(monkeypatch, tmp_path):
    monkeypatch.setattr(eff.shutil, "which", lambda name: None)
    with eff.mps_daemon(tmp_path) as env:
        assert env == "nvidia-cuda-mps-control is not on this box"


def test_an_arm_on_the_pinned_corpus_reads_its_mapped_blocks_and_names_its_hash(tmp_path):
    from decentrain.data.blocks import build_corpus
    from decentrain.data.prepare import prepare
    from decentrain.models.factory import build_tokenizer
    from decentrain.testing.pinned import tiny_config, tiny_domains, write_source

    manifest = prepare(tiny_config(tmp_path / "corpus"), tiny_domains(write_source(tmp_path)))
    c = cfg(
        smoke=True,
        data="pinned",
        steps=4,
        global_batch=8,
        micro_batch=2,
        seq_len=32,
        eval_blocks=4,
        log_every=2,
        precision="fp32",
        overrides=[f"data.pinned_dir={tmp_path / 'corpus'}", "data.domains=[alpha,beta]"],
    )
    tc, _ = ge.compose(ge.arm_overrides(c, PRESET, "noloco", 0, tmp_path / "x"))
    corpus = build_corpus(tc.data, build_tokenizer(tc.model))
    assert ge.corpus_identity("pinned", corpus) == {"name": "pinned", "hash": manifest["corpus_hash"]}
    run = ge.run_arm(c, PRESET, "noloco", 0, corpus, CPU)
    assert set(run["bpb_by_domain"]) == {"alpha", "beta"} and 0 < run["bpb"] < 12
    assert run["test_blocks_per_domain"] == {"alpha": 4, "beta": 4} and run["replicas"] == 4
    assert (
        ge.ledger_key(c, PRESET, ge.corpus_identity("pinned", corpus), CPU)["protocol"]
        != ge.ledger_key(
            ge.EvidenceConfig(**{**c.__dict__, "overrides": []}), PRESET, {"name": "pinned", "hash": "h"}, CPU
        )["protocol"]
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit")
def test_exits_zero_without_cuda(capsys):
    assert ge.main([]) == 0
    assert "no CUDA device" in capsys.readouterr().out


@pytest.mark.slow  # 8 tiny runs (4 arms x 2 seeds, 4 replicas as threads) on CPU: ~40 s on 2 cores
def test_smoke_runs_every_arm_for_two_seeds_and_pools_them_in_its_own_ledger(tmp_path, monkeypatch, capsys):
    from benchmarks import harness
    from benchmarks.record import validate_record

    monkeypatch.setattr(harness, "SMOKE_DIR", tmp_path)
    monkeypatch.setattr(ge, "SMOKE_DIR", tmp_path)
    assert ge.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert "[gpu_evidence] seed 1 sparseloco" in out and "noloco better diloco (bpb), 2 paired seed(s)" in out
    record = json.loads((tmp_path / "gpu_evidence.json").read_text())
    assert validate_record(record) == [] and record["not_for_commit"]
    f = record["figures"]
    runs = {(r["seed"], r["arm"]): r for r in f["this_call"]["runs"]}
    assert sorted(runs) == [(s, a) for s in (0, 1) for a in sorted(PRESET["arms"])]
    for r in runs.values():
        assert math.isfinite(r["bpb"]) and set(r["bpb_by_domain"]) == {"python_docs", "python_stdlib"}
        assert r["tokens_per_s"] > 0 and r["wall_s"] > 0 and r["replicas"] == (1 if r["arm"] == "ddp" else 4)
    sent = {a: runs[(0, a)]["bytes_sent_per_worker"] for a in PRESET["arms"]}
    assert sent["ddp"] > sent["diloco"] > sent["sparseloco"] > 0 and sent["noloco"] < sent["diloco"]
    assert f["pooled"]["seeds"] == [0, 1] and [c["n"] for c in f["pooled"]["comparisons"]] == [2, 2, 2, 2]
    assert all(c["verdict"] in ("better", "worse", "reaches", "undecided") for c in f["pooled"]["comparisons"])
    assert any("untuned defaults" in d for d in f["departures"])
    lines = Ledger(tmp_path / "ledger").lines("gpu_evidence")[0]
    assert [ln["seed"] for ln in lines] == [0, 1] and all(ln["provenance"]["smoke"] for ln in lines)
    assert not (ge.ROOT / "benchmarks" / "results" / "gpu_evidence.json").exists()  # never over a committed result
