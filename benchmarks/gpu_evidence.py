"""gpu_evidence: DDP (token-matched), DiLoCo, NoLoCo and SparseLoCo at ~25M parameters on one GPU, two seeds a
call, each seed appended to a committed ledger that pools every seed so far under the decision rule.

A GPU is lent here for about fifteen minutes now and then. One call fits that window: two new seeds of the
four arms (the preset's settings, benchmarks/presets/gpu_25m.yaml, "untuned defaults" until issue 39's tuning
chooses them), 4 replicas sharing the GPU as threads of this process (the library's own `Trainer`, algorithm
hooks and in-process transport: algorithms/pretraining/inprocess_replicas.py; one start-up for every run),
DDP as one replica with the whole global batch (the same gradient average as 4-rank DDP, and the same
batches: the sampler draws one global batch per step whatever the world). Each arm's time is printed as
it goes, and a run that would overrun `--budget-s` is not started: a seed left incomplete keeps the arms
it finished, and pairs only where both arms of a comparison ran.

Per arm and seed: test-split bits per byte (the Trainer's rule; per domain and overall, the mean over domains
as eval/bpb; each replica's model, averaged over replicas, as the NoLoCo paper averages perplexity), bytes
sent per worker (the transport's count; DDP's is its ring all-reduce per step, the figure 4-rank DDP logs),
tokens/s of the whole GPU (the replicas' rates summed, warm-up window dropped), MFU (core/metrics.py's FLOPs
per token against the GPU's dense bf16 peak), and wall seconds with start-up.

The ledger (benchmarks/ledger.py, benchmarks/results/ledger/gpu_evidence.jsonl) keys seeds by
- numerics: the hash of the arms' golden trajectories (tests/unit/fixtures/golden: a change to any
  algorithm's numbers must regenerate them, a refactor leaves them) with the torch version;
- corpus: its name and hash; gpu: the device name and CUDA version;
- protocol: the digest of the preset and every setting that changes the numbers (not compile or logging),
so seeds from sessions days apart pool when, and only when, they ran the same computation. The report
applies benchmarks/protocol.py's rule to every comparison of the preset: "undecided" until the seeds suffice.

Shared-GPU efficiency (`--efficiency`): short timed runs of one arm under variants, through the recipe's own
command line: replicas as threads (one CUDA context, the GIL) or as processes over gloo (4 contexts time-sliced
by the GPU, pair exchanges staged through host memory), eager or compiled (`blocks`, `model`), twice the
micro-batch (how launch-bound the step is), CUDA MPS when the box has it, fewer host reads (`--log-every`).
Measured only on a GPU: on a CPU the figures say nothing about a shared GPU, and the record says so.

    python -m benchmarks.gpu_evidence                    # two new seeds, the ledger, the pooled verdicts
    python -m benchmarks.gpu_evidence --efficiency default --budget-s 240
    python -m benchmarks.gpu_evidence --smoke            # the whole path on CPU, tiny; never the committed ledger

Without CUDA (and without --smoke) it prints why and exits 0. docs/gpu.md says how a GPU session runs it.
"""

from __future__ import annotations

import hashlib
import json
import math
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu_efficiency import (
    DEFAULT_VARIANTS,
    VARIANTS,
    Batch,
    merged,
    replica_rate,
    run_variant,
    stop_groups,
    variant_line,
)
from benchmarks.harness import ROOT, SMOKE_DIR, Harness, bench_parser, header, mean_std, parse, save_figure
from benchmarks.ledger import Comparison, Ledger, key_id, verdict_lines

NAME = "gpu_evidence"
PRESET = ROOT / "benchmarks" / "presets" / "gpu_25m.yaml"
GOLDEN = ROOT / "tests" / "unit" / "fixtures" / "golden"
# settings that change how fast a run goes, not what it computes: left out of the protocol digest
NOT_PROTOCOL = (
    "compile",
    "log_every",
    "budget_s",
    "efficiency",
    "efficiency_steps",
    "efficiency_budget_s",
    "seeds",
    "peak_flops",
    "preset",
    "device",
)
# --smoke: a tiny model on two quick domains of the box's own text (no reasoning_gym), H=2
SMOKE = {
    "hidden": 32,
    "layers": 2,
    "heads": 2,
    "ffn": 64,
    "max_bytes": 20_000,
    "domains": "[python_docs,python_stdlib]",
    "inner_steps": 2,
}


@dataclass
class EvidenceConfig:
    preset: str = "benchmarks/presets/gpu_25m.yaml"
    data: str = "pinned"  # a conf/data option: pinned (issue 38's corpus), offline (the box's own text)
    overrides: list[str] = field(default_factory=list)  # more Hydra overrides for every run (--override, repeated)
    steps: int = 400
    workers: int = 4  # replicas sharing the GPU
    global_batch: int = 64
    micro_batch: int = 16
    seq_len: int = 512
    eval_blocks: int = 128  # test blocks per domain for the final bits per byte
    precision: str = "bf16_autocast"
    compile: str = "none"  # none | blocks | model: a speed setting (not in the ledger key)
    log_every: int = 50  # steps between host reads of the loss (fewer round trips)
    seeds: int = 2  # new seeds this call: the ledger's smallest unused ones
    budget_s: float = 420.0  # the call's wall time, start-up included: a run that would overrun is skipped
    efficiency: str = ""  # comma-separated variants (benchmarks/gpu_efficiency.py), "default", or "" for none
    efficiency_steps: int = 40
    efficiency_budget_s: float = 90.0
    peak_flops: float | None = None
    device: str = "auto"  # auto: cuda (cpu for --smoke); --smoke --device cuda checks the path on a GPU
    smoke: bool = False

    @property
    def torch_device(self) -> torch.device:
        return torch.device(
            ("cpu" if self.smoke or not torch.cuda.is_available() else "cuda") if self.device == "auto" else self.device
        )

    def __post_init__(self) -> None:
        for f in ("steps", "workers", "global_batch", "micro_batch", "seq_len", "eval_blocks", "log_every", "seeds"):
            if getattr(self, f) < 1:
                raise ValueError(f"--{f.replace('_', '-')}={getattr(self, f)} must be >= 1")
        if self.global_batch % (self.workers * self.micro_batch):
            raise ValueError(
                f"--global-batch={self.global_batch} must be a multiple of --workers x --micro-batch "
                f"= {self.workers * self.micro_batch}"
            )
        if self.compile not in ("none", "blocks", "model"):
            raise ValueError(f"--compile={self.compile!r}: one of none, blocks, model")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"--device={self.device!r}: one of auto, cpu, cuda")


# -- the preset and each run's config ---------------------------------------------------
def load_preset(path: str | Path) -> dict[str, Any]:
    """The arms' settings, checked: every arm names its algorithm, every comparison names two arms."""
    from omegaconf import OmegaConf

    p = Path(path) if Path(path).is_absolute() else ROOT / path
    if not p.is_file():
        raise ValueError(f"--preset={path}: no such file")
    preset = OmegaConf.to_container(OmegaConf.load(p), resolve=True)
    missing = [k for k in ("status", "model", "common", "arms", "comparisons", "rule") if k not in preset]
    if missing:
        raise ValueError(f"--preset={path}: missing {missing}")
    for arm, ovr in preset["arms"].items():
        if not any(o.startswith("algorithm=") for o in ovr):
            raise ValueError(f"--preset={path}: arm {arm} names no algorithm= override")
    preset["comparisons"] = [Comparison(**c) for c in preset["comparisons"]]
    for c in preset["comparisons"]:
        if {c.contender, c.baseline} - set(preset["arms"]):
            raise ValueError(f"--preset={path}: comparison {c.label} names an arm the preset does not run")
    return preset


def algorithm_of(preset: dict[str, Any], arm: str) -> str:
    return next(o.split("=", 1)[1] for o in preset["arms"][arm] if o.startswith("algorithm="))


def arm_overrides(
    cfg: EvidenceConfig, preset: dict[str, Any], arm: str, seed: int, run_dir: Path | str, steps: int | None = None
) -> list[str]:
    """The recipe overrides of one arm's run (the same a `python -m recipes.train` command line takes)."""
    steps = steps or cfg.steps
    run = [
        f"data={cfg.data}",
        f"data.seq_len={cfg.seq_len}",
        f"model.max_seq_len={cfg.seq_len}",
        f"train.steps={steps}",
        f"train.global_batch_size={cfg.global_batch}",
        f"train.micro_batch_size={cfg.micro_batch}",
        f"train.eval_every={steps}",
        "train.eval_batches=1",
        f"train.checkpoint_every={steps}",
        "train.keep_checkpoints=1",
        f"train.seed={seed}",
        f"train.device={cfg.torch_device.type}",
        f"train.precision={cfg.precision}",
        f"train.compile={cfg.compile}",
        "logger.progress=false",
        "logger.console=false",
        f"logger.log_every={cfg.log_every}",
        "logger.all_ranks=true",
        "resume=false",
        f"run_dir={run_dir}",
    ]
    if cfg.peak_flops:
        run.append(f"logger.peak_flops={cfg.peak_flops}")
    smoke = []
    if cfg.smoke:  # a tiny model, a little text, H=2: the path, not the figures
        smoke = [
            f"model.hidden_size={SMOKE['hidden']}",
            f"model.num_layers={SMOKE['layers']}",
            f"model.num_heads={SMOKE['heads']}",
            f"model.intermediate_size={SMOKE['ffn']}",
            "train.threads=1",
        ]
        if cfg.data == "offline":
            smoke += [f"data.max_bytes_per_domain={SMOKE['max_bytes']}", f"data.domains={SMOKE['domains']}"]
        if algorithm_of(preset, arm) != "ddp":
            smoke.append(f"algorithm.inner_steps={SMOKE['inner_steps']}")
    return merged(preset["model"], preset["common"], preset["arms"][arm], run, smoke, cfg.overrides)


def compose(overrides: list[str]):
    """(TrainConfig, resolved dict) of the recipe's config with `overrides`: what `recipes.train` would run."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import OmegaConf

    from decentrain.config import config_from_dict, register_configs
    from recipes import conf_dir

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        raw = OmegaConf.to_container(hydra_compose(config_name="config", overrides=overrides), resolve=True)
    return config_from_dict(raw), raw


# -- the ledger key ---------------------------------------------------------------------
def digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def numerics_digest(preset: dict[str, Any], root: Path = GOLDEN) -> str:
    """The hash of the arms' golden trajectories: they move exactly when an algorithm's numbers do."""
    names = sorted({algorithm_of(preset, a) for a in preset["arms"]})
    files = sorted(p for n in names for p in root.glob(f"{n}_rank*.json"))
    return digest([[p.name, hashlib.sha256(p.read_bytes()).hexdigest()] for p in files])


def corpus_identity(data_name: str, corpus) -> dict[str, str]:
    """The corpus's name and hash: its own where it has one (the pinned corpus's manifest hash), else the hash
    of every block it serves (the offline corpus reads the box's files: another box, another hash)."""
    if getattr(corpus, "hash", None):
        return {"name": corpus.name, "hash": corpus.hash}
    h = hashlib.sha256()
    for domain in sorted(corpus.blocks):
        for split in ("train", "val", "test"):
            blocks = torch.as_tensor(corpus.split(split, domain)[:])
            h.update(f"{domain}/{split}/{tuple(blocks.shape)}".encode())
            h.update(blocks.to(torch.int32).numpy().tobytes())
    return {"name": data_name, "hash": "blocks:" + h.hexdigest()[:32]}


def gpu_identity(device: torch.device) -> str:
    if device.type != "cuda":
        return "cpu"
    return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"


def ledger_key(
    cfg: EvidenceConfig, preset: dict[str, Any], corpus_id: dict[str, str], device: torch.device
) -> dict[str, Any]:
    protocol = {k: v for k, v in asdict(cfg).items() if k not in NOT_PROTOCOL}
    protocol["preset"] = {k: preset[k] for k in ("model", "common", "arms")}
    return {
        "numerics": {"goldens": numerics_digest(preset), "torch": torch.__version__.split("+")[0]},
        "corpus": corpus_id,
        "gpu": gpu_identity(device),
        "protocol": digest(protocol),
    }


# -- one arm, one seed ------------------------------------------------------------------
def test_bpb(tc, runs, corpus, eval_blocks: int, device: torch.device) -> dict[str, Any]:
    """Test-split bits per byte of each replica's final model, per domain (the Trainer's own rule,
    trainer.evaluate_bits), averaged over the replicas; overall is the mean over domains, as eval/bpb."""
    from decentrain.algorithms.pretraining.precision import resolve_precision
    from decentrain.algorithms.pretraining.trainer import evaluate_bits
    from decentrain.models.factory import build_model, build_tokenizer

    if corpus.token_bytes is None:
        raise ValueError(f"data={tc.data.name}: the corpus has no byte counts per token; bits per byte need them")
    blocks = {d: torch.as_tensor(corpus.split("test", d)[:eval_blocks]).to(device) for d in corpus.blocks}
    model = build_model(tc.model, build_tokenizer(tc.model)).to(device)
    per_replica = []
    for run in runs:
        model.load_state_dict(run.weights)
        per_replica.append(
            evaluate_bits(
                model,
                blocks,
                tc.train.micro_batch_size,
                device,
                resolve_precision(tc.train.precision, device),
                corpus.token_bytes.to(device),
            )[1]
        )
    overall = [statistics.fmean(r.values()) for r in per_replica]
    return {
        "bpb": statistics.fmean(overall),
        "bpb_by_domain": {d: statistics.fmean(r[d] for r in per_replica) for d in blocks},
        "bpb_replica_spread": max(overall) - min(overall),
        "test_blocks_per_domain": {d: len(b) for d, b in blocks.items()},
    }


def run_arm(
    cfg: EvidenceConfig, preset: dict[str, Any], arm: str, seed: int, corpus, device: torch.device
) -> dict[str, Any]:
    """Train one arm for one seed (replicas as threads), then its figures."""
    from decentrain.algorithms.pretraining.inprocess_replicas import run_replicas_in_process
    from decentrain.algorithms.pretraining.precision import resolve_precision, weight_dtype
    from decentrain.algorithms.pretraining.trainer import model_flops_per_token
    from decentrain.core.comm.transport import ring_all_reduce_bytes
    from decentrain.core.metrics import metrics_file, peak_flops
    from decentrain.models.factory import build_model, build_tokenizer, num_params

    algo = algorithm_of(preset, arm)
    replicas = 1 if algo == "ddp" else cfg.workers  # DDP token-matched: one replica, the whole global batch
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"{NAME}_{arm}_") as tmp:
        tc, _ = compose(arm_overrides(cfg, preset, arm, seed, tmp))
        runs = run_replicas_in_process(tc, replicas, Path(tmp))
        rates = [replica_rate(Path(tmp) / metrics_file(r)) for r in range(replicas)]
    train_s = max(r.result.seconds for r in runs)
    figures = test_bpb(tc, runs, corpus, cfg.eval_blocks, device)
    model = build_model(tc.model, build_tokenizer(tc.model))
    params, flops_tok = num_params(model), model_flops_per_token(model, cfg.seq_len)
    if algo == "ddp":  # what each of `workers` DDP ranks would send: its ring all-reduce of the gradients, every step
        grad_bytes = params * weight_dtype(resolve_precision(tc.train.precision, device)).itemsize
        sent, how = ring_all_reduce_bytes(grad_bytes, cfg.workers) * cfg.steps, "modelled (ring all-reduce per step)"
    else:
        sent, how = statistics.fmean(float(r.result.bytes_sent or 0) for r in runs), "counted by the transport"
    tokens_s = sum(r for r in rates if r) if all(rates) else None
    peak = peak_flops(torch.cuda.get_device_name(device), cfg.peak_flops) if device.type == "cuda" else None
    return {
        **figures,
        "arm": arm,
        "algorithm": algo,
        "seed": seed,
        "replicas": replicas,
        "params": params,
        "bytes_sent_per_worker": sent,
        "bytes_sent_how": how,
        "tokens_per_s": tokens_s,
        "mfu": tokens_s * flops_tok / peak if tokens_s and peak else None,
        "flops_per_token": flops_tok,
        "train_s": train_s,
        "wall_s": time.perf_counter() - t0,
        "final_train_loss": statistics.fmean(r.result.train_loss for r in runs),
    }


# -- the call ---------------------------------------------------------------------------
class Budget:
    """The call's wall clock: a run starts only if its estimate (the same arm's last time, else the slowest
    run so far) fits in what is left."""

    def __init__(self, seconds: float, clock=time.perf_counter):
        self.seconds, self.clock, self.t0 = seconds, clock, clock()
        self.times: dict[str, float] = {}

    def left(self) -> float:
        return self.seconds - (self.clock() - self.t0)

    def estimate(self, arm: str) -> float:
        return self.times.get(arm, max(self.times.values(), default=0.0))

    def fits(self, arm: str) -> bool:
        return self.estimate(arm) <= self.left()

    def spent(self, arm: str, seconds: float) -> None:
        self.times[arm] = seconds


def run_seeds(
    cfg: EvidenceConfig, preset: dict[str, Any], seeds: list[int], corpus, device: torch.device, budget: Budget
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """Every arm of every seed, seed by seed (a finished seed is a complete paired set); returns
    (the ledger's seed records, every run's figures, the runs skipped for time)."""
    records, runs, skipped = [], [], []
    for seed in seeds:
        arms: dict[str, Any] = {}
        for arm in preset["arms"]:
            if not budget.fits(arm):
                skipped.append(f"seed {seed} {arm}: ~{budget.estimate(arm):.0f}s needed, {budget.left():.0f}s left")
                print(f"[{NAME}] skip seed {seed} {arm}: {skipped[-1].split(': ', 1)[1]}", flush=True)
                continue
            fig = run_arm(cfg, preset, arm, seed, corpus, device)
            budget.spent(arm, fig["wall_s"])
            runs.append(fig)
            arms[arm] = {
                k: fig[k] for k in ("bpb", "bpb_by_domain", "bytes_sent_per_worker", "tokens_per_s", "mfu", "wall_s")
            }
            print(
                f"[{NAME}] seed {seed} {arm:<10} {fig['wall_s']:5.0f}s (train {fig['train_s']:.0f}s)  bpb "
                f"{fig['bpb']:.4f}  sent {fig['bytes_sent_per_worker'] / 1e6:8.2f} MB/worker  "
                + (f"{fig['tokens_per_s'] / 1e3:7.0f}k tok/s" if fig["tokens_per_s"] else "tok/s n/a")
                + (f"  MFU {fig['mfu']:.1%}" if fig["mfu"] else "")
                + f"  [{budget.left():.0f}s left]",
                flush=True,
            )
        if arms:
            records.append({"seed": seed, "arms": arms})
    return records, runs, skipped


def departures(cfg: EvidenceConfig, preset: dict[str, Any], runs: list[dict[str, Any]], train_blocks: int) -> list[str]:
    """How this run departs from the protocol a claim needs (issue 39: tuned arms, >= 20 tokens/parameter,
    the pinned corpus, <= half an epoch here), each computed from the run."""
    out = []
    if preset["status"] != "tuned":
        out.append(f"arms at {preset['status']} ({preset['source']})")
    tokens = cfg.steps * cfg.global_batch * cfg.seq_len
    if runs:
        out.append(f"{tokens / runs[0]['params']:.1f} tokens per parameter (a pre-training claim wants >= 20)")
    epochs = cfg.steps * cfg.global_batch / max(1, train_blocks)
    if epochs > 0.5:
        out.append(f"{epochs:.2f} epochs of the corpus's {train_blocks} training blocks (at most 0.5 asked)")
    if cfg.data != "pinned":
        out.append(f"data={cfg.data}, not the pinned corpus")
    if cfg.smoke:
        out.append("smoke: a tiny model on CPU; the figures check the path only")
    return out


def pooled_arms(pooled_seeds: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per arm, mean ± std over every pooled seed of its bits per byte and bytes sent."""
    by: dict[str, dict[str, list[float]]] = {}
    for rec in pooled_seeds.values():
        for arm, f in rec.get("arms", {}).items():
            for k in ("bpb", "bytes_sent_per_worker", "mfu"):
                if isinstance(f.get(k), (int, float)):
                    by.setdefault(arm, {}).setdefault(k, []).append(float(f[k]))
    return {arm: {k: mean_std(v) for k, v in figs.items()} for arm, figs in by.items()}


def measure(cfg: EvidenceConfig, hz: Harness, ledger: Ledger) -> dict[str, Any]:
    from decentrain.data.blocks import build_corpus
    from decentrain.models.factory import build_tokenizer

    budget = Budget(cfg.budget_s)
    device = cfg.torch_device
    preset = load_preset(cfg.preset)
    tc, _ = compose(arm_overrides(cfg, preset, next(iter(preset["arms"])), 0, tempfile.gettempdir()))
    corpus = build_corpus(tc.data, build_tokenizer(tc.model))
    key = ledger_key(cfg, preset, corpus_identity(cfg.data, corpus), device)
    seeds = ledger.next_seeds(NAME, key, cfg.seeds)
    print(
        f"[{NAME}] key {key_id(key)} {json.dumps(key)}; seeds {seeds}; {len(preset['arms'])} arms; "
        f"budget {cfg.budget_s:.0f}s ({budget.left():.0f}s left after start-up)",
        flush=True,
    )
    records, runs, skipped = run_seeds(cfg, preset, seeds, corpus, device, budget)
    provenance = {
        "git_sha": hz.sha,
        "dirty": hz.dirty,
        "smoke": cfg.smoke,
        "code_version": hz.code,
        "command": " ".join(sys.argv),
        "compile": cfg.compile,
    }
    ledger.append(NAME, key, records, provenance)
    pool = ledger.pool(NAME, key, include_dirty=cfg.smoke)  # a smoke ledger is all smoke: pool it to check the path
    pooled = ledger.pooled(NAME, key, preset["comparisons"], preset["rule"], include_dirty=cfg.smoke)
    for line in verdict_lines(pooled):
        print(f"[{NAME}] {line}", flush=True)
    fig = {
        "key": key,
        "key_id": key_id(key),
        "preset": {
            "path": cfg.preset,
            "status": preset["status"],
            "source": preset["source"],
            "arms": preset["arms"],
            "model": preset["model"],
            "common": preset["common"],
        },
        "rule": preset["rule"],
        "this_call": {"seeds": seeds, "runs": runs, "skipped": skipped, "appended": len(records)},
        "pooled": pooled,
        "pooled_arms": pooled_arms(pool.seeds),
        "other_keys_in_ledger": len(set(ledger.keys(NAME)) - {key_id(key)}),
        "departures": departures(cfg, preset, runs, len(corpus.train_blocks())),
        "efficiency": None,
    }
    if cfg.efficiency:
        names = list(DEFAULT_VARIANTS) if cfg.efficiency == "default" else [v for v in cfg.efficiency.split(",") if v]
        fig["efficiency"] = run_efficiency(cfg, preset, names, device, hz_dir(hz))
    return fig


def hz_dir(hz: Harness) -> Path:
    """Where a call keeps the variants' logs: beside its record (runs/bench_smoke for a smoke run)."""
    out = (SMOKE_DIR if hz.smoke else ROOT / "runs") / f"{NAME}_logs"
    out.mkdir(parents=True, exist_ok=True)
    return out


# -- shared-GPU efficiency (the variants: benchmarks/gpu_efficiency.py) ------------------
def run_efficiency(
    cfg: EvidenceConfig, preset: dict[str, Any], names: list[str], device: torch.device, keep: Path
) -> dict[str, Any]:
    """Each variant in turn while the budget lasts: tokens/s of the whole GPU and MFU (on a CPU: the path only)."""
    from decentrain.algorithms.pretraining.trainer import model_flops_per_token
    from decentrain.core.metrics import peak_flops
    from decentrain.models.factory import build_model, build_tokenizer

    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise ValueError(f"--efficiency: unknown variant(s) {unknown}; allowed: {list(VARIANTS)} or 'default'")
    arm = "noloco" if "noloco" in preset["arms"] else next(iter(preset["arms"]))
    tc, _ = compose(arm_overrides(cfg, preset, arm, 0, tempfile.gettempdir()))
    flops_tok = model_flops_per_token(build_model(tc.model, build_tokenizer(tc.model)), cfg.seq_len)
    peak = peak_flops(torch.cuda.get_device_name(device), cfg.peak_flops) if device.type == "cuda" else None
    budget, rows = Budget(cfg.efficiency_budget_s), []
    for name in names:
        if budget.left() < 10:
            rows.append({"variant": name, "status": "not run: efficiency budget spent"})
            continue
        row = run_variant(
            name,
            lambda d: arm_overrides(cfg, preset, arm, 0, d, cfg.efficiency_steps),
            Batch(cfg.workers, cfg.global_batch, cfg.micro_batch),
            flops_tok,
            peak,
            budget.left(),
            keep,
        )
        rows.append(row)
        print(f"[{NAME}] efficiency {variant_line(row)}", flush=True)
    return {
        "arm": arm,
        "steps": cfg.efficiency_steps,
        "device": gpu_identity(device),
        "variants": rows,
        "measured": device.type == "cuda",
        "note": None
        if device.type == "cuda"
        else "CPU: the variants ran to check the path; their speeds say nothing about a shared GPU",
    }


# -- report -----------------------------------------------------------------------------
def text_table(record: dict[str, Any]) -> str:
    f = record["figures"]
    lines = [
        header(record),
        f"ledger key {f['key_id']}: {json.dumps(f['key'])}",
        f"preset {f['preset']['path']} ({f['preset']['status']}); decision rule {json.dumps(f['rule'])}",
        "",
        f"this call: seeds {f['this_call']['seeds']}, {f['this_call']['appended']} appended",
        f"{'seed':>4} {'arm':<11} {'bpb':>7} {'MB sent/worker':>15} {'tokens/s':>10} {'MFU':>6} {'wall s':>7}",
    ]
    for r in f["this_call"]["runs"]:
        mfu = f"{r['mfu']:.1%}" if r["mfu"] else "n/a"
        lines.append(
            f"{r['seed']:>4} {r['arm']:<11} {r['bpb']:>7.4f} {r['bytes_sent_per_worker'] / 1e6:>15.2f} "
            f"{(r['tokens_per_s'] or math.nan):>10.0f} {mfu:>6} {r['wall_s']:>7.0f}"
        )
    lines += [f"skipped for time: {s}" for s in f["this_call"]["skipped"]]
    p = f["pooled"]
    lines += [
        "",
        f"pooled: {len(p['seeds'])} seed(s) {p['seeds']} under this key"
        + (
            f" ({p['duplicates']} duplicate, {p['excluded_dirty']} dirty/smoke lines left out)"
            if p["duplicates"] or p["excluded_dirty"]
            else ""
        ),
    ]
    for arm, s in f["pooled_arms"].items():
        lines.append(
            f"  {arm:<11} bpb {s['bpb']['mean']:.4f} ± {s['bpb']['std']:.4f} (n={s['bpb']['n']}), "
            f"{s['bytes_sent_per_worker']['mean'] / 1e6:.2f} MB sent/worker"
        )
    lines += [f"  {line}" for line in verdict_lines(p)]
    if f["efficiency"]:
        e = f["efficiency"]
        lines += [
            "",
            f"shared-GPU efficiency: {e['arm']}, {e['steps']} steps, {e['device']}"
            + (f" ({e['note']})" if e["note"] else ""),
        ]
        lines += [f"  {variant_line(row)}" for row in e["variants"]]
    lines += ["", "departures from the protocol a claim needs:"] + [f"  - {d}" for d in f["departures"]]
    return "\n".join(lines)


def plot(record: dict[str, Any], png: Path) -> None:
    import matplotlib.pyplot as plt

    f = record["figures"]
    seeds = f["pooled"]["seeds"]
    arms = list(f["preset"]["arms"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    rows = {r["arm"]: [] for r in f["this_call"]["runs"]}
    for r in f["this_call"]["runs"]:
        rows[r["arm"]].append(r)
    for i, arm in enumerate(arms):
        s = f["pooled_arms"].get(arm)
        if s:
            ax1.errorbar([i], [s["bpb"]["mean"]], yerr=[s["bpb"]["std"]], fmt="o", capsize=4, color="k")
            ax1.scatter([i] * len(s["bpb"]["values"]), s["bpb"]["values"], alpha=0.4)
            ax2.bar([i], [s["bytes_sent_per_worker"]["mean"] / 1e6])
    for ax in (ax1, ax2):
        ax.set_xticks(range(len(arms)), arms)
    ax1.set_ylabel("test bits per byte (pooled seeds)")
    ax2.set_ylabel("MB sent per worker")
    ax2.set_yscale("log")
    fig.suptitle(f"{NAME} on {f['key']['gpu']}: {len(seeds)} pooled seed(s)")
    fig.tight_layout()
    save_figure(fig, png)


def parser():
    p = bench_parser(__doc__, seeds=EvidenceConfig.seeds)  # --seeds N: N new seeds, the ledger's smallest unused
    for f in fields(EvidenceConfig):
        if f.name not in ("seeds", "smoke", "peak_flops", "overrides"):
            p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    p.add_argument(
        "--override",
        dest="overrides",
        action="append",
        default=[],
        help="a Hydra override for every run, e.g. data.pinned_dir=/path (repeat for more)",
    )
    p.add_argument("--peak-flops", type=float, default=None, help="FLOP/s of the GPU (default: looked up by name)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parse(parser(), argv)
    flags = {f.name: getattr(args, f.name) for f in fields(EvidenceConfig) if f.name != "smoke"}
    try:
        cfg = EvidenceConfig(**flags, smoke=args.smoke)
        if cfg.smoke:  # the whole path, tiny, on CPU: 8 steps, 4 replicas, H=2, the box's own text
            cfg.steps, cfg.global_batch, cfg.micro_batch, cfg.seq_len, cfg.eval_blocks = 8, 16, 4, 64, 4
            cfg.data, cfg.log_every, cfg.precision, cfg.efficiency_steps = "offline", 4, "fp32", 8
        load_preset(cfg.preset)
    except ValueError as e:
        print(f"config error: {e}")
        return 2
    if not cfg.smoke and cfg.torch_device.type != "cuda" and cfg.device == "auto":
        print(
            f"{NAME}: no CUDA device here; nothing measured (run it on a GPU machine, or --smoke to check "
            "the code path)"
        )
        return 0
    hz = Harness(NAME, __file__, asdict(cfg), allow_dirty=args.allow_dirty, fresh=args.fresh, smoke=cfg.smoke)
    ledger = Ledger(SMOKE_DIR / "ledger") if cfg.smoke else Ledger()
    previous = signal.signal(signal.SIGTERM, stop_groups)  # a phase cap takes the variants' processes down too
    try:
        fig = measure(cfg, hz, ledger)
    finally:
        signal.signal(signal.SIGTERM, previous)
    paths = hz.write(fig, text_table, plot)
    print(paths["txt"].read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
