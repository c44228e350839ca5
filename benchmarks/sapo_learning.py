"""sapo_learning: does single-node SAPO RL (8/0) learn, and does it match TRL's GRPOTrainer on identical settings?

Issue 18's gate: one node, I=8 local groups, no peers, gains >= 10 points of held-out greedy
accuracy over its start. The node runs the ordinary recipe (`python -m recipes.rl
sapo=learn_cpu`, conf/sapo/learn_cpu.yaml); TRL's `GRPOTrainer` runs in
this process with the same warm start, task mix, template, exact-match reward, G=8, 8 questions
per step, T=1, top-k off, max 8 new tokens stopping at "\\n", KL 0, clip 0.2/0.28, token-mean
(dapo) loss, group-scaled advantages, one update per batch, AdamW (betas 0.9/0.99, wd 0) at a
constant lr, grad clip 1. Both evaluate greedy exact accuracy on the same held-out questions
(dataset seed + 1000) before training and every `eval_every` steps.

Departure: the two systems draw their questions from the same mix independently (the node from
its seeded stream, TRL from a list drawn with the run's seed), so seeds pair the settings, not the
question order. The policy is a ~1.9M-param byte Llama warm-started by SFT (sapo_swarm's cache),
not the paper's Qwen2.5-0.5B; the RL mix is conf/task/sapo_learn.yaml (3 easy tasks; the warm start is
trained on conf/task/sapo_mix.yaml), not 9 tasks.

    python -m benchmarks.sapo_learning                                 # decentrain + TRL, 3 seeds
    python -m benchmarks.sapo_learning --systems decentrain --lrs 1e-4,3e-4 --seeds 1   # lr probe
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from benchmarks.common import ROOT, prompt_as_is_tokenizer, round_rows, run_module
from benchmarks.harness import (
    RESULTS,
    Harness,
    config_key,
    config_parser,
    fmt,
    header,
    mean_std,
    parse_config,
    reanalyse,
    save_figure,
)
from benchmarks.sapo_swarm import LAST_EVALS, last_evals_mean, warm_start
from benchmarks.sapo_swarm import BenchConfig as SwarmBench

GATE = 0.10


@dataclass
class BenchConfig:
    lrs: str = "3e-4"
    systems: str = "decentrain,trl"
    rounds: int = 150
    # TRL's run length (0: `rounds`). A shorter TRL run (it costs ~2x a node's round on CPU) is
    # compared with the node on the evaluations both made; the gate reads the node's full run.
    trl_rounds: int = 0
    eval_every: int = 25
    eval_prompts: int = 64  # per task
    work_dir: str = "runs/bench/sapo_learning"


def node_overrides(b: BenchConfig, lr: float, seed: int, model_dir: Path, run_dir: Path) -> list[str]:
    return [
        "sapo=learn_cpu",
        f"model.pretrained={model_dir}",
        f"model.tokenizer={model_dir}",
        f"optim.lr={lr}",
        f"train.rounds={b.rounds}",
        f"train.seed={seed}",
        f"eval.every={b.eval_every}",
        f"eval.prompts_per_task={b.eval_prompts}",
        "train.threads=1",
        "train.checkpoint_every=50",
        "train.keep_checkpoints=1",
        "logger.progress=false",
        f"run_dir={run_dir}",
        "resume=true",
    ]


def run_decentrain(b: BenchConfig, lr: float, seed: int, model_dir: Path, run_dir: Path) -> dict:
    wall = run_module("recipes.rl", node_overrides(b, lr, seed, model_dir, run_dir))
    rows = round_rows(run_dir / "node0" / "metrics.jsonl")
    evals = {int(r["step"]): r["heldout_greedy/mean"] for r in rows if "heldout_greedy/mean" in r}
    per_task = {
        int(r["step"]): {
            k.split("/", 1)[1]: v
            for k, v in r.items()
            if k.startswith("heldout_greedy/") and k != "heldout_greedy/mean"
        }
        for r in rows
        if "heldout_greedy/mean" in r
    }
    train = [r for r in rows if int(r["step"]) >= 1]
    return {
        "heldout": evals,
        "heldout_per_task": per_task,
        "reward": [round(float(r["reward"]), 5) for r in train],
        "wall_s": wall,
    }


def run_trl(b: BenchConfig, lr: float, seed: int, model_dir: Path, run_dir: Path) -> dict:
    import torch
    from datasets import Dataset
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from decentrain.algorithms.sapo.config import SAPOConfig
    from decentrain.algorithms.sapo.evaluation import greedy_accuracy, heldout_items
    from decentrain.config import register_configs
    from decentrain.tasks import PromptTemplate, TaskMixture, Verifier

    register_configs("sapo")
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        raw = OmegaConf.to_container(
            compose(
                "rl",
                overrides=[o for o in node_overrides(b, lr, seed, model_dir, run_dir) if not o.startswith("run_dir")]
                + ["run_dir=unused"],
            ),
            resolve=True,
        )
    # the node's own settings
    cfg: SAPOConfig = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(SAPOConfig), raw))
    torch.set_num_threads(1)
    template = PromptTemplate(cfg.template)
    verifier = Verifier(template, cfg.reward)
    mixture = TaskMixture(cfg.task)
    questions = cfg.batch.num_local
    rng = np.random.default_rng(seed)
    rounds = b.trl_rounds or b.rounds
    items = mixture.sample(questions * rounds, rng)
    data = Dataset.from_list([{"prompt": template(it.question), "idx": i} for i, it in enumerate(items)])

    def reward(prompts, completions, idx, **_):
        return [r for i, c in zip(idx, completions) for r in verifier.rewards(items[i], [c])]

    tokenizer = prompt_as_is_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"][0]
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, newline]  # stop at "\n", as the node does
    g = cfg.loss.num_generations
    config = GRPOConfig(
        output_dir=str(run_dir),
        per_device_train_batch_size=questions * g,
        num_generations=g,
        max_completion_length=cfg.sampling.max_new_tokens,
        temperature=cfg.sampling.temperature,
        top_k=cfg.sampling.top_k or 0,
        top_p=cfg.sampling.top_p,
        beta=cfg.loss.beta,
        loss_type=cfg.loss.loss_type,
        epsilon=cfg.loss.epsilon,
        epsilon_high=cfg.loss.epsilon_high,
        scale_rewards=cfg.loss.scale_rewards,
        num_iterations=cfg.loss.num_iterations,
        learning_rate=lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=cfg.optim.weight_decay,
        adam_beta1=cfg.optim.betas[0],
        adam_beta2=cfg.optim.betas[1],
        max_grad_norm=cfg.optim.grad_clip,
        max_steps=rounds,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        shuffle_dataset=False,
        seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
        # As the node trains: fp32, no activation checkpointing. TRL defaults both on; on CPU its bf16
        # autocast and the recompute made a step ~40x slower than the node's (56 s vs 1.4 s).
        bf16=False,
        gradient_checkpointing=False,
    )
    heldout = heldout_items(cfg.task, cfg.eval.prompts_per_task, cfg.eval.seed_offset)
    evals, per_task, rewards = {}, {}, []

    def record(step, m):
        acc = greedy_accuracy(m, tokenizer, template, cfg.sampling, heldout)
        evals[step] = acc.pop("mean")
        per_task[step] = acc

    class Eval(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **k):
            record(0, model)

        def on_step_end(self, args, state, control, model=None, **k):
            if state.global_step % b.eval_every == 0 or state.global_step == rounds:
                record(state.global_step, model)

        def on_log(self, args, state, control, logs=None, **k):
            if logs and "reward" in logs:
                rewards.append(round(float(logs["reward"]), 5))

    t0 = time.perf_counter()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Eval()],
    )
    trainer.train()
    verifier.close()
    return {"heldout": evals, "heldout_per_task": per_task, "reward": rewards, "wall_s": time.perf_counter() - t0}


def run_job(job: dict) -> dict:
    b = BenchConfig(**job["bench"])
    run_dir = ROOT / b.work_dir / f"{job['system']}_lr{job['lr']}_seed{job['seed']}_{config_key(job)[:8]}"
    fn = run_decentrain if job["system"] == "decentrain" else run_trl
    out = fn(b, job["lr"], job["seed"], ROOT / job["model_dir"], run_dir)
    out["heldout"] = {int(k): v for k, v in out["heldout"].items()}
    return out


def summarize(runs: list[dict]) -> dict:
    """Held-out accuracy is the mean of the last 3 evaluations after the start (`last_evals_mean`), every task
    averaged and per task; the gate reads its gain over the start."""
    steps = sorted(int(k) for k in runs[0]["heldout"])
    curve = np.array(
        [[r["heldout"][str(s)] if str(s) in r["heldout"] else r["heldout"][s] for s in steps] for r in runs]
    )
    last3 = np.array([last_evals_mean(dict(zip(steps, row)), steps) for row in curve])
    gains = last3 - curve[:, 0]
    tasks = {}
    if all(r.get("heldout_per_task") for r in runs):
        for t in next(iter(runs[0]["heldout_per_task"].values())):
            per = [{int(k): v[t] for k, v in r["heldout_per_task"].items()} for r in runs]
            start = [c[steps[0]] for c in per]
            last = [last_evals_mean(c, steps) for c in per]
            tasks[t] = {
                "start": mean_std(start),
                "last3": mean_std(last),
                "gain": mean_std([b - a for a, b in zip(start, last)]),
            }
    return {
        "steps": steps,
        "heldout_mean": curve.mean(0).round(4).tolist(),
        "heldout_std": curve.std(0, ddof=1 if len(runs) > 1 else 0).round(4).tolist(),
        "last3_steps": [s for s in steps if s > 0][-LAST_EVALS:],
        "start": mean_std(curve[:, 0].tolist()),
        "last3": mean_std(last3.tolist()),
        "final": mean_std(curve[:, -1].tolist()),
        "best": mean_std(curve.max(1).tolist()),
        "tasks": tasks,
        "gain": mean_std(gains.tolist()),
        "gate_met": bool(gains.mean() >= GATE),
        "reward_first_10": mean_std([float(np.mean(r["reward"][:10])) for r in runs]),
        "reward_last_10": mean_std([float(np.mean(r["reward"][-10:])) for r in runs]),
        "wall_s": mean_std([r["wall_s"] for r in runs]),
    }


def main() -> None:
    ap = config_parser(BenchConfig, __doc__)
    ap.add_argument(
        "--regenerate",
        action="store_true",
        help="re-analyse benchmarks/results/sapo_learning.json's per-seed runs with this code; runs nothing",
    )
    b, nseeds, allow_dirty, fresh, regen, smoke = parse_config(ap, BenchConfig, "regenerate", "smoke")
    if regen:
        print(regenerate(RESULTS / "sapo_learning.json", allow_dirty)["txt"].read_text())
        return
    swarm = SwarmBench()  # its warm start (cached under .cache/)
    hz = Harness(
        "sapo_learning",
        __file__,
        {
            "bench": asdict(b),
            "seeds": list(range(nseeds)),
            "warm_start": asdict(swarm),
            "node_overrides_example": node_overrides(b, float(b.lrs.split(",")[0]), 0, Path("<sft>"), Path("<run>")),
        },
        allow_dirty=allow_dirty,
        fresh=fresh,
        smoke=smoke,
    )
    model_dir, sft = warm_start(swarm)
    model_rel = model_dir.relative_to(ROOT).as_posix()
    lrs, systems = [float(x) for x in b.lrs.split(",")], b.systems.split(",")
    jobs = [
        {"bench": asdict(b), "system": s, "lr": lr, "seed": seed, "model_dir": model_rel}
        for seed in range(nseeds)
        for lr in lrs
        for s in systems
    ]
    res = hz.run_jobs(jobs, run_job, desc="sapo learning")
    figures = {"sft": sft, **analyze(b, nseeds, jobs, res), "gate": GATE_TEXT}
    paths = hz.write(figures, text, plot)
    print(paths["txt"].read_text())


GATE_TEXT = f"8/0 held-out greedy gain (last-3 mean minus start) >= {GATE:.0%} points"


def analyze(b: BenchConfig, nseeds: int, jobs: list[dict], res: list[dict]) -> dict:
    lrs, systems = [float(x) for x in b.lrs.split(",")], b.systems.split(",")
    arms = {}
    for s in systems:
        for lr in lrs:
            runs = [r for j, r in zip(jobs, res) if j["system"] == s and j["lr"] == lr]
            arms[f"{s} lr={lr:g}"] = {**summarize(runs), "per_seed": runs}
    agree = {}
    if "decentrain" in systems and "trl" in systems:
        for lr in lrs:
            d, t = arms[f"decentrain lr={lr:g}"], arms[f"trl lr={lr:g}"]
            steps = [s for s in t["steps"] if s in d["steps"]]  # the evaluations both made
            pick = lambda a, k: np.array([a[k][a["steps"].index(s)] for s in steps])  # noqa: E731
            diff = pick(d, "heldout_mean") - pick(t, "heldout_mean")
            spread = np.sqrt(pick(d, "heldout_std") ** 2 + pick(t, "heldout_std") ** 2)
            # With one seed there is no seed spread: the binomial std of a held-out accuracy stands in.
            n = 3 * b.eval_prompts
            binom = np.sqrt(2 * pick(d, "heldout_mean") * (1 - pick(d, "heldout_mean")) / n)
            noise = spread if nseeds > 1 else binom
            gd = pick(d, "heldout_mean")[-1] - pick(d, "heldout_mean")[0]
            gt = pick(t, "heldout_mean")[-1] - pick(t, "heldout_mean")[0]
            # Own-rollout reward over the rounds both trained, mean over rounds and seeds.
            both = min(len(x["reward"]) for x in d["per_seed"] + t["per_seed"])
            rd, rt = (float(np.mean([x["reward"][:both] for x in a["per_seed"]])) for a in (d, t))
            agree[f"{lr:g}"] = {
                "steps": steps,
                "max_abs_diff": float(np.abs(diff).max()),
                "diff_per_eval": diff.round(4).tolist(),
                "noise_per_eval": noise.round(4).tolist(),
                "noise": "seed std" if nseeds > 1 else "binomial std",
                "within_seed_noise": bool((np.abs(diff) <= np.maximum(2 * noise, 1e-9)).all()),
                "gain_diff": float(gd - gt),
                "rounds_compared": both,
                "reward_decentrain": rd,
                "reward_trl": rt,
            }
    return {"arms": arms, "agreement": agree}


def regenerate(path: Path, allow_dirty: bool = False) -> dict[str, Path]:
    """Re-analyse a committed result from its per-seed runs; the runs' provenance is kept."""

    def figures(rec: dict) -> dict:
        b, seeds = BenchConfig(**rec["config"]["bench"]), rec["config"]["seeds"]
        jobs, res = [], []
        for name, arm in rec["figures"]["arms"].items():
            system, lr = name.split(" lr=")
            for seed, run in zip(seeds, arm["per_seed"]):
                jobs.append({"system": system, "lr": float(lr), "seed": seed})
                res.append(run)
        return {"sft": rec["figures"]["sft"], **analyze(b, len(seeds), jobs, res), "gate": GATE_TEXT}

    return reanalyse(path, figures, text, plot, allow_dirty)


def text(rec: dict) -> str:
    f, b = rec["figures"], rec["config"]["bench"]
    acc = f["sft"]["accuracy"]
    lines = [
        header(rec),
        "",
        f"one node, I=8 J=0, G=8, T=1, top-k off, exact-match reward, {b['rounds']} rounds (TRL: "
        f"{b.get('trl_rounds') or b['rounds']}), held-out greedy accuracy on "
        f"{b['eval_prompts']} questions per task every {b['eval_every']} rounds; seeds {rec['config']['seeds']}",
        "warm start: "
        + ", ".join(
            f"{t} sampled {a['sampled_accuracy']:.1%} greedy {a['greedy_accuracy']:.1%}" for t, a in acc.items()
        ),
        "",
        f"held-out = mean of the last {LAST_EVALS} evaluations after the start (rounds "
        f"{next(iter(f['arms'].values())).get('last3_steps')}), every task averaged; gain = that minus the start",
        "| arm | held-out greedy start | held-out last 3 | gain (last 3 - start) | gate >= 10 pts | own reward "
        "first 10 -> last 10 | final | best |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, a in f["arms"].items():
        lines.append(
            f"| {name} | {fmt(a['start'], 3)} | {fmt(a['last3'], 3)} | {fmt(a['gain'], 3)} | "
            f"{'MET' if a['gate_met'] else 'not met'} | {a['reward_first_10']['mean']:.3f} -> "
            f"{a['reward_last_10']['mean']:.3f} | {fmt(a['final'], 3)} | {fmt(a['best'], 3)} |"
        )
    lines.append("")
    for name, a in f["arms"].items():
        if a.get("tasks"):
            lines.append(
                f"{name} per task (start -> last 3, gain): "
                + "; ".join(
                    f"{t} {v['start']['mean']:.3f} -> {v['last3']['mean']:.3f} ({fmt(v['gain'], 3)})"
                    for t, v in a["tasks"].items()
                )
            )
    for name, a in f["arms"].items():
        lines.append(
            f"{name}: held-out greedy per eval step {a['steps']}: "
            + ", ".join(f"{m:.3f}±{s:.3f}" for m, s in zip(a["heldout_mean"], a["heldout_std"]))
        )
    for lr, g in f["agreement"].items():
        lines.append(
            f"decentrain vs TRL at lr {lr}, evaluations at steps {g['steps']}: max |diff| of mean held-out curves "
            f"{g['max_abs_diff']:.3f}, gain diff {g['gain_diff']:+.3f}; within 2x the {g['noise']} at every eval: "
            f"{'yes' if g['within_seed_noise'] else 'NO'}; own-rollout reward over rounds 1-{g['rounds_compared']}: "
            f"decentrain {g['reward_decentrain']:.3f}, TRL {g['reward_trl']:.3f}"
        )
    return "\n".join(lines)


def plot(rec: dict, png: Path) -> None:
    import matplotlib.pyplot as plt

    f = rec["figures"]
    fig, (a, bx) = plt.subplots(1, 2, figsize=(12, 4.2))
    for name, arm in f["arms"].items():
        m, s = np.array(arm["heldout_mean"]), np.array(arm["heldout_std"])
        (line,) = a.plot(arm["steps"], m, marker="o", label=name)
        a.fill_between(arm["steps"], m - s, m + s, color=line.get_color(), alpha=0.2)
        r = np.mean([x["reward"] for x in arm["per_seed"]], 0)
        w = min(10, len(r))
        bx.plot(
            np.arange(w, len(r) + 1), np.convolve(r, np.ones(w) / w, mode="valid"), color=line.get_color(), label=name
        )
    a.set(
        xlabel="round / step",
        ylabel="held-out greedy exact accuracy",
        title="held-out greedy accuracy (mean ± std over seeds)",
    )
    bx.set(xlabel="round / step", ylabel="own-rollout reward (10-step avg)", title="training reward")
    for ax in (a, bx):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"SAPO single node vs TRL GRPOTrainer @ {rec['git_sha'][:10]}")
    fig.tight_layout()
    save_figure(fig, png, dpi=110)


if __name__ == "__main__":
    main()
