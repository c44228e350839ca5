"""benchmarks/sapo_swarm_gpu (sapo_swarm's mechanism mode with SmolLM2-135M-Instruct on one GPU) on CPU: each arm's
overrides compose to the config they name, the ledger key moves with what is measured and not with how, and --smoke
runs the whole path (tiny GGUF, 2 nodes x 2 rounds, warm starts, both arms, ledger, pooled verdicts)."""

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from benchmarks import sapo_swarm_gpu as bench
from benchmarks.common import ROOT
from decentrain.algorithms.sapo.config import SAPOConfig
from decentrain.config import register_configs
from recipes import conf_dir, typed_config


@pytest.mark.parametrize("arm", ["8/0", "4/4", "4/4+is"])
def test_each_arm_composes_to_the_swarm_it_names(arm):
    b = bench.BenchConfig()
    models = [Path(f"/ckpt/warm{k}") for k in range(3)]
    overrides = bench.rl_overrides(b, arm, 5, models, "cuda", Path("/tmp/run"))
    register_configs("sapo")
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        dcfg = compose("rl", overrides=overrides)
    cfg = typed_config(OmegaConf.to_container(dcfg, resolve=True), SAPOConfig)
    i, j = (int(x) for x in arm.split("+")[0].split("/"))
    assert (cfg.batch.num_local, cfg.batch.num_external, cfg.num_nodes, cfg.train.device) == (i, j, 8, "cuda")
    assert (
        cfg.template.chat and cfg.model.name == "smollm2_135m_instruct" and cfg.loss.external_is == arm.endswith("+is")
    )
    assert cfg.sampling.cache == "dynamic" and cfg.train.seed == 5 and cfg.eval.every == b.heldout_every
    assert [cfg.for_node(n).model.pretrained for n in range(8)] == [str(models[n % 3]) for n in range(8)]


def test_sft_overrides_cut_the_mix_to_the_subset():
    o = bench.sft_overrides(bench.BenchConfig(), ["chain_sum", "polynomial_multiplication"], bench.SMOLLM2, "cuda")
    assert "task.tasks=[chain_sum,polynomial_multiplication]" in o and "~task.task_kwargs.basic_arithmetic" in o
    with pytest.raises(ValueError, match="warm_start_tasks: \\['word_sorting'\\] not in"):
        bench.sft_overrides(bench.BenchConfig(), ["word_sorting"], bench.SMOLLM2, "cuda")


def test_ledger_key_moves_with_the_protocol_not_with_budget_or_device(tmp_path):
    pytest.importorskip("gguf")
    from decentrain.models.tiny_gguf import write_tiny_gguf

    write_tiny_gguf(tmp_path / "m.gguf")
    b = bench.BenchConfig(gguf_file=str(tmp_path / "m.gguf"))
    key = bench.ledger_key(b, b.gguf_file, "cpu")
    assert key == bench.ledger_key(
        dataclasses.replace(b, budget_s=100.0, device="cpu", work_dir="x"), b.gguf_file, "cpu"
    )
    assert key["protocol"] != bench.ledger_key(dataclasses.replace(b, lr=1e-5), b.gguf_file, "cpu")["protocol"]
    assert key["model"]["file"] == "m.gguf" and len(key["model"]["sha256"]) == 16


@pytest.mark.slow
def test_smoke_runs_the_whole_path_on_cpu():
    """~2 min on 2 loaded cores: 2 tiny warm starts, 8/0 and 4/4 with 2 nodes x 2 rounds, a smoke ledger, verdicts."""
    pytest.importorskip("gguf")
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.sapo_swarm_gpu", "--smoke"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rec = json.loads((ROOT / "runs" / "bench_smoke" / "sapo_swarm_gpu.json").read_text())
    f = rec["figures"]
    assert f["this_call"]["appended"] == 1 and not f["this_call"]["skipped"]
    (seed,) = f["this_call"]["seeds"]
    assert set(f["this_call"]["runs"][str(seed)]) == {"8/0", "4/4"}
    assert [c["metric"] for c in f["pooled"]["comparisons"]] == ["heldout_gain", "missing_gain"]
    assert "4/4 better 8/0 (heldout_gain)" in proc.stdout
