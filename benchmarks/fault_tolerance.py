"""fault_tolerance: what a dead or stopped worker costs NoLoCo (gossip) and DiLoCo (collective), as torchft measures it.

Each scenario runs the ordinary pre-training recipe with 4 local gloo workers on loopback
and injects one fault into rank 2 once rank 0 has logged `--fault-step` steps:

  noloco/none   no fault: the reference throughput and loss
  noloco/kill   SIGKILL rank 2: survivors should keep >= 90% of their steps/minute
  noloco/stop   SIGSTOP rank 2 for `--stop-s` seconds, then SIGCONT: rounds lost, time to rejoin
  diloco/none   no fault
  diloco/kill   SIGKILL rank 2: the collective job stops; the same command, re-run, resumes
                from the last checkpoint, and its losses must equal the no-fault run's exactly

Steps/minute are each survivor's own (first to last logged step, from its metrics file);
"rounds lost" counts survivors' outer rounds with `partner_missed`, against the rounds in
which the faulty rank was their partner (the unavoidable ones).

    python -m benchmarks.fault_tolerance                 # ~10 min on 2 busy cores
    python -m benchmarks.fault_tolerance --seeds 0 1 2   # mean ± std over seeds
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from benchmarks.results_io import read_live_jsonl

ROOT = Path(__file__).resolve().parents[1]
FAULTY = 2


def rows(run_dir: Path, rank: int) -> list[dict]:
    return read_live_jsonl(run_dir / ("metrics.jsonl" if rank == 0 else f"metrics.rank{rank}.jsonl"))


def worker_pid(run_dir: Path, token: str, rank: int) -> int:
    workers = run_dir / "workers.json"  # written by launch_survivors (gossip algorithms)
    if workers.exists():
        return int(json.loads(workers.read_text())[str(rank)])
    # torch elastic's workers: find the child whose environment says RANK=<rank>
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            status = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"TORCHELASTIC_RUN_ID" in b"\0".join(env) and \
                f"DECENTRAIN_BENCH={token}".encode() in env and " Z " not in status:
            return int(pid)
    raise RuntimeError(f"rank {rank}'s worker not found")


def run(algorithm: str, fault: str, args: argparse.Namespace, run_dir: Path, seed: int, resume: bool = False) -> dict:
    overrides = [
        f"algorithm={algorithm}", "launcher.nproc_per_node=4", f"train.steps={args.steps}", f"algorithm.inner_steps={args.inner_steps}",
        "model.hidden_size=32", "model.num_layers=2", "model.num_heads=2", "model.intermediate_size=64",
        "data.seq_len=32", "data.max_bytes_per_domain=20000", "data.domains=[python_docs,licenses]",
        "train.global_batch_size=8", "train.micro_batch_size=2", "train.eval_batches=1", f"train.eval_every={args.steps}",
        f"train.checkpoint_every={args.checkpoint_every}", f"train.seed={seed}", "train.threads=1", "logger.progress=false",
        "logger.log_every=1", "logger.all_ranks=true", f"run_dir={run_dir}", f"resume={str(resume).lower()}",
    ]
    if algorithm == "noloco":
        overrides.append(f"algorithm.deadline_s={args.deadline_s}")
    token = uuid.uuid4().hex  # marks this run's workers in /proc/<pid>/environ
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "DECENTRAIN_BENCH": token}
    t0 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "recipes.train", *overrides], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    events: dict[str, float] = {}
    if fault != "none":
        while proc.poll() is None and not any(r.get("step", 0) >= args.fault_step for r in rows(run_dir, 0)):
            time.sleep(0.1)
        if proc.poll() is None:
            pid = worker_pid(run_dir, token, FAULTY)
            events["fault_at"] = time.time()
            if fault == "kill":
                os.kill(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(args.stop_s)
                os.kill(pid, signal.SIGCONT)
                events["resumed_at"] = time.time()
    try:
        out, _ = proc.communicate(timeout=args.run_timeout_s)
    finally:
        try:  # the launcher's process group holds every worker
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return {"returncode": proc.returncode, "wall_s": time.time() - t0, "events": events, "tail": out[-1500:]}


def survivor_figures(run_dir: Path, args: argparse.Namespace, events: dict) -> dict:
    from decentrain.core.gossip import gossip_groups, group_of

    per_rank = {}
    for rank in range(4):
        rs = [r for r in rows(run_dir, rank) if "train/loss" in r]
        if len(rs) < 2:
            per_rank[rank] = None
            continue
        minutes = (rs[-1]["time"] - rs[0]["time"]) / 60
        outer = [r for r in rows(run_dir, rank) if "outer/partner_missed" in r]
        missed = [int(r["outer/round"]) - 1 for r in outer if r["outer/partner_missed"]]
        with_faulty = [t for t in range(len(outer)) if FAULTY in group_of(rank, gossip_groups(t, 4, 0))]
        first_fault_round = next((int(r["outer/round"]) - 1 for r in outer if r["time"] >= events.get("fault_at", 1e18)), None)
        per_rank[rank] = {
            "steps": rs[-1]["step"], "steps_per_min": (len(rs) - 1) / minutes if minutes > 0 else None,
            "final_train_loss": rs[-1]["train/loss"], "rounds": len(outer), "rounds_missed": len(missed),
            "rounds_missed_not_with_faulty": len([t for t in missed if t not in with_faulty]),
            "first_fault_round": first_fault_round, "missed_rounds": missed,
            "round_times": [r["time"] for r in outer],
        }
    return per_rank


def rejoin(per_rank: dict, events: dict) -> dict:
    """For a stopped rank: rounds and seconds from SIGCONT to its first averaged (not missed) round."""
    me = per_rank.get(FAULTY)
    if not me or "resumed_at" not in events:
        return {}
    after = [(t, i) for i, t in enumerate(me["round_times"]) if t >= events["resumed_at"]]
    for n, (t, i) in enumerate(after):
        if i not in me["missed_rounds"]:
            return {"rounds_to_rejoin": n + 1, "seconds_to_rejoin": t - events["resumed_at"]}
    return {"rounds_to_rejoin": None, "seconds_to_rejoin": None}


def mean_std(xs: list[float]) -> dict:
    xs = [x for x in xs if x is not None]
    return {"mean": statistics.mean(xs) if xs else None, "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--inner-steps", type=int, default=4)
    ap.add_argument("--fault-step", type=int, default=40)
    ap.add_argument("--stop-s", type=float, default=8.0)
    ap.add_argument("--deadline-s", type=float, default=3.0)
    ap.add_argument("--checkpoint-every", type=int, default=20)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--run-timeout-s", type=float, default=1200)
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "fault_tolerance"))
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from benchmarks.results_io import RESULTS, write_results

    runs: dict[str, list[dict]] = {}
    for seed in args.seeds:
        for algo, fault in (("noloco", "none"), ("noloco", "kill"), ("noloco", "stop"), ("diloco", "none"), ("diloco", "kill")):
            name = f"{algo}/{fault}"
            run_dir = Path(args.runs_dir) / f"seed{seed}" / algo / fault
            print(f"[fault_tolerance] seed {seed} {name} ...", flush=True)
            res = run(algo, fault, args, run_dir, seed)
            res["per_rank"] = survivor_figures(run_dir, args, res["events"])
            if algo == "diloco" and fault == "kill":
                res["first_returncode"] = res["returncode"]
                res["restart"] = run(algo, "none", args, run_dir, seed, resume=True)  # the supported recovery: re-run
                res["per_rank"] = survivor_figures(run_dir, args, res["events"])
            res["rejoin"] = rejoin(res["per_rank"], res["events"])
            runs.setdefault(name, []).append(res)
            print(f"  rc {res['returncode']} wall {res['wall_s']:.0f}s", flush=True)

    def ratio(name: str, ref: str, key: str, ranks=(0, 1, 3)) -> list[float]:
        out = []
        for res, base in zip(runs[name], runs[ref]):
            for r in ranks:
                a, b = res["per_rank"].get(r), base["per_rank"].get(r)
                if a and b and a[key] and b[key]:
                    out.append(a[key] / b[key])
        return out

    figures: dict = {"scenarios": {}}
    for name, rs in runs.items():
        figures["scenarios"][name] = {
            "returncode": [r["returncode"] for r in rs], "wall_s": mean_std([r["wall_s"] for r in rs]),
            "per_rank": [{k: ({kk: vv for kk, vv in v.items() if kk != "round_times"} if v else None) for k, v in r["per_rank"].items()} for r in rs],
            "rejoin": [r["rejoin"] for r in rs],
        }
    nk, ns = "noloco/kill", "noloco/stop"
    figures["noloco_kill_survivor_throughput_ratio"] = mean_std(ratio(nk, "noloco/none", "steps_per_min"))
    figures["noloco_stop_survivor_throughput_ratio"] = mean_std(ratio(ns, "noloco/none", "steps_per_min"))
    figures["noloco_kill_final_loss_ratio"] = mean_std(ratio(nk, "noloco/none", "final_train_loss"))
    figures["noloco_stop_final_loss_ratio"] = mean_std(ratio(ns, "noloco/none", "final_train_loss"))
    figures["noloco_kill_survivors_finished"] = [sum(1 for r in (0, 1, 3) if (res["per_rank"].get(r) or {}).get("steps") == args.steps) for res in runs[nk]]
    figures["rounds_lost_beyond_pairs_with_faulty"] = {
        n: [sum((res["per_rank"].get(r) or {}).get("rounds_missed_not_with_faulty", 0) for r in (0, 1, 3)) for res in runs[n]] for n in (nk, ns)}
    figures["noloco_stop_rounds_to_rejoin"] = mean_std([r["rejoin"].get("rounds_to_rejoin") for r in runs[ns]])
    figures["noloco_stop_seconds_to_rejoin"] = mean_std([r["rejoin"].get("seconds_to_rejoin") for r in runs[ns]])
    dk = runs["diloco/kill"]
    figures["diloco_kill_first_returncode"] = [r["first_returncode"] for r in dk]
    figures["diloco_restart_returncode"] = [r["restart"]["returncode"] for r in dk]
    exact = []
    for res, base in zip(dk, runs["diloco/none"]):
        a = {x["step"]: x["train/loss"] for x in rows(Path(args.runs_dir) / f"seed{args.seeds[len(exact)]}" / "diloco" / "kill", 0) if "train/loss" in x}
        b = {x["step"]: x["train/loss"] for x in rows(Path(args.runs_dir) / f"seed{args.seeds[len(exact)]}" / "diloco" / "none", 0) if "train/loss" in x}
        exact.append(a == b and len(a) == args.steps)
    figures["diloco_resume_exact"] = exact
    figures["diloco_kill_total_wall_ratio"] = mean_std([(r["wall_s"] + r["restart"]["wall_s"]) / b["wall_s"] for r, b in zip(dk, runs["diloco/none"])])
    figures["targets"] = {
        "noloco_survivors_ge_90pct_throughput": (figures["noloco_kill_survivor_throughput_ratio"]["mean"] or 0) >= 0.9,
        "at_most_one_round_per_affected_pair": all(v == 0 for vs in figures["rounds_lost_beyond_pairs_with_faulty"].values() for v in vs),
        "rejoin_within_2_rounds": (figures["noloco_stop_rounds_to_rejoin"]["mean"] or 99) <= 2,
        "diloco_resumes_exactly": all(exact),
    }
    out = write_results("fault_tolerance", vars(args), figures)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    first = {n: rs[0] for n, rs in runs.items()}
    for n, style in (("noloco/none", "-"), ("noloco/kill", "--"), ("noloco/stop", ":")):
        for r in (0, 1, 3):
            rs = [x for x in rows(Path(args.runs_dir) / f"seed{args.seeds[0]}" / n, r) if "train/loss" in x]
            if rs:
                ax.plot([x["time"] - rs[0]["time"] for x in rs], [x["step"] for x in rs], style, lw=1,
                        label=n if r == 0 else None, color={"noloco/none": "C0", "noloco/kill": "C1", "noloco/stop": "C2"}[n])
    if "fault_at" in first["noloco/kill"]["events"]:
        ax.axvline(0, color="k", lw=0.3)
    ax.set(xlabel="seconds since the survivor's first step", ylabel="step (ranks 0, 1, 3)",
           title=f"NoLoCo survivors, 4 workers, fault on rank {FAULTY} at step {args.fault_step}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "fault_tolerance.png", dpi=120)

    lines = [f"fault_tolerance ({out.name}): 4 workers on loopback, fault on rank {FAULTY} at step {args.fault_step}, seeds {args.seeds}",
             f"{'figure':48s} {'mean':>8s} {'std':>7s}"]
    for k in ("noloco_kill_survivor_throughput_ratio", "noloco_stop_survivor_throughput_ratio", "noloco_kill_final_loss_ratio",
              "noloco_stop_final_loss_ratio", "noloco_stop_rounds_to_rejoin", "noloco_stop_seconds_to_rejoin", "diloco_kill_total_wall_ratio"):
        v = figures[k]
        lines.append(f"{k:48s} {v['mean'] if v['mean'] is not None else float('nan'):8.3f} {v['std']:7.3f}")
    for k in ("noloco_kill_survivors_finished", "rounds_lost_beyond_pairs_with_faulty", "diloco_kill_first_returncode",
              "diloco_restart_returncode", "diloco_resume_exact", "targets"):
        lines.append(f"{k}: {figures[k]}")
    text = "\n".join(lines)
    (RESULTS / "fault_tolerance.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
