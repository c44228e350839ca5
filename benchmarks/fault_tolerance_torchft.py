"""fault_tolerance_torchft: what a killed replica group costs DDP and DiLoCo under
`launcher.fault_tolerance=torchft`, beside fault_tolerance.py's whole-group restart rows.

Each run is the ordinary recipe with 2 replica groups of 1 rank each (loopback, one machine),
a lighthouse started by the recipe and `launcher.max_restarts=1`. `kill`: once group 0 has
logged `--fault-step` steps, SIGKILL group 1's worker; torchrun restarts that group alone
and it heals from group 0 at its first quorum. `none`: no fault, the reference.

Figures per run: group 0's (the survivor's) steps/min over its training window, against the
no-fault run; steps it rolled back (a logged step lower than one before: must be 0); work it
lost (DDP: steps dropped by a failed commit; DiLoCo: syncs not committed); seconds from the
kill to the healed group's first logged step with both groups participating
(`ft/participants` = 2; DDP heals before a step and contributes to it, DiLoCo at the sync
where it heals) and that step's distance past the survivor's step at the kill; whether the
two groups' final weights are bit-equal (the saved model files). Departures from torchft's
measurements: one shared 2-core machine (a dead group hands its CPU to the survivor, which
flatters the survivor's rate), small step counts, no emulated WAN.

    python -m benchmarks.fault_tolerance_torchft --steps 40 --fault-step 12 --seeds 1   # ~15 min on 2 loaded cores
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import Harness, fmt, mean_std
from benchmarks.results_io import read_live_jsonl

ROOT = Path(__file__).resolve().parents[1]


def worker_pids(torchrun_pid: int) -> list[int]:
    """The recipe workers under one torchrun agent (its python children)."""
    out = subprocess.run(["pgrep", "-P", str(torchrun_pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def train_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "train/loss" in r]


def steps_per_min(rows: list[dict]) -> float | None:
    rows = train_rows(rows)
    if len(rows) < 2 or rows[-1]["time"] <= rows[0]["time"]:
        return None
    return (rows[-1]["step"] - rows[0]["step"]) / (rows[-1]["time"] - rows[0]["time"]) * 60


def rolled_back(rows: list[dict]) -> int:
    steps = [r["step"] for r in train_rows(rows)]
    return sum(max(0, a - b + 1) for a, b in zip(steps, steps[1:]) if b <= a)


def model_digest(run_dir: Path) -> str | None:
    files = sorted((run_dir / "model").glob("*.safetensors"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    run_dir = Path(job["runs_dir"]) / f"{job['algorithm']}_{job['fault']}_s{job['seed']}"
    if run_dir.exists():
        subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    experiment = {"ddp": "ddp_cpu", "diloco": "diloco_cpu"}[job["algorithm"]]
    args = [f"experiment={experiment}", "launcher.fault_tolerance=torchft", "launcher.replicas=2", "launcher.nproc_per_node=1",
            "launcher.max_restarts=1", f"train.steps={job['steps']}", "train.global_batch_size=8", "train.micro_batch_size=8",
            "logger.log_every=1", "train.eval_every=100000", "train.checkpoint_every=100000", f"train.seed={job['seed']}",
            f"run_dir={run_dir}", "logger.progress=false"]
    if job["algorithm"] == "diloco":
        args.append(f"algorithm.inner_steps={job['inner_steps']}")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RUST_LOG": "warn"}
    log = open(run_dir.parent / f"{run_dir.name}.log", "w") if run_dir.parent.exists() else subprocess.DEVNULL
    proc = subprocess.Popen([sys.executable, "-m", "recipes.train", *args], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    killed_at, survivor_step_at_kill = None, None
    deadline = time.time() + job["timeout_s"]
    while proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
        if job["fault"] == "kill" and killed_at is None:
            rows = train_rows(read_live_jsonl(run_dir / "replica_0" / "metrics.jsonl"))
            if rows and rows[-1]["step"] >= job["fault_step"]:
                agents = json.loads((run_dir / "replicas.json").read_text())["torchrun"]
                for pid in worker_pids(int(agents["1"])):
                    os.kill(pid, signal.SIGKILL)
                killed_at, survivor_step_at_kill = time.time(), rows[-1]["step"]
    if proc.poll() is None:
        proc.kill()
        return {"error": f"timed out after {job['timeout_s']} s"}
    survivor = read_live_jsonl(run_dir / "replica_0" / "metrics.jsonl")
    other = read_live_jsonl(run_dir / "replica_1" / "metrics.jsonl")
    last = train_rows(survivor)[-1] if train_rows(survivor) else {}
    out: dict[str, Any] = {
        "exit_code": proc.returncode,
        "survivor_steps_per_min": steps_per_min(survivor),
        "survivor_final_step": last.get("step"),
        "survivor_rolled_back_steps": rolled_back(survivor),
        "survivor_work_lost": last.get("ft/dropped_steps", last.get("ft/failed_syncs")),
        "bit_equal_final_weights": (model_digest(run_dir / "replica_0") is not None
                                    and model_digest(run_dir / "replica_0") == model_digest(run_dir / "replica_1")),
    }
    if killed_at is not None:
        back = [r for r in train_rows(other) if r["time"] > killed_at and r.get("ft/participants") == 2.0]
        out["kill_to_contributing_s"] = back[0]["time"] - killed_at if back else None
        out["contributing_step"] = back[0]["step"] if back else None
        out["survivor_step_at_kill"] = survivor_step_at_kill
    return out


def _ms(values: list[float]) -> dict[str, Any] | None:
    return mean_std(values) if values else None


def summarise(jobs: list[dict], results: list[dict]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for algorithm in dict.fromkeys(j["algorithm"] for j in jobs):
        base = [r for j, r in zip(jobs, results) if j["algorithm"] == algorithm and j["fault"] == "none"]
        kill = [r for j, r in zip(jobs, results) if j["algorithm"] == algorithm and j["fault"] == "kill"]
        ratio = [k["survivor_steps_per_min"] / b["survivor_steps_per_min"] for k, b in zip(kill, base)
                 if k.get("survivor_steps_per_min") and b.get("survivor_steps_per_min")]
        figures[algorithm] = {
            "runs": {"none": base, "kill": kill},
            "survivor_rate_vs_no_fault": _ms(ratio),
            "kill_to_contributing_s": _ms([k["kill_to_contributing_s"] for k in kill if k.get("kill_to_contributing_s") is not None]),
            "rolled_back_steps": sum(k.get("survivor_rolled_back_steps") or 0 for k in kill),
            "work_lost": [k.get("survivor_work_lost") for k in kill],
            "bit_equal_after_heal": all(k.get("bit_equal_final_weights") for k in kill) if kill else None,
            "targets": {"survivor_rate>=0.9": bool(ratio) and min(ratio) >= 0.9,
                        "rolled_back==0": all((k.get("survivor_rolled_back_steps") or 0) == 0 for k in kill)},
        }
    return figures


def text(rec: dict) -> str:
    lines = [f"{rec['name']} @ {rec['git_sha']}: torchft replica groups (2 x 1 rank, loopback), SIGKILL group 1"]
    for algorithm, f in rec["figures"].items():
        rate, back = f["survivor_rate_vs_no_fault"], f["kill_to_contributing_s"]
        lines.append(f"{algorithm}: survivor steps/min vs no fault {fmt(rate, 3) if rate else 'n/a'}; "
                     f"kill -> healed group contributing {fmt(back, 3) if back else 'never (came back after the survivor finished)'} s; "
                     f"rolled back {f['rolled_back_steps']}; work lost {f['work_lost']}; bit-equal after heal {f['bit_equal_after_heal']}")
        for k in f["runs"]["none"] + f["runs"]["kill"]:
            lines.append(f"  run: {json.dumps(k)}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algorithms", nargs="+", default=["ddp", "diloco"], choices=["ddp", "diloco"])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--fault-step", type=int, default=12)
    ap.add_argument("--inner-steps", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--faults", nargs="+", default=["none", "kill"], choices=["none", "kill"])
    ap.add_argument("--timeout-s", type=float, default=1200)
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "fault_tolerance_torchft"))
    ap.add_argument("--name", default="fault_tolerance_torchft")
    ap.add_argument("--allow-dirty", action="store_true")
    args = ap.parse_args()
    Path(args.runs_dir).mkdir(parents=True, exist_ok=True)
    jobs = [{"algorithm": a, "fault": f, "seed": s, "steps": args.steps, "fault_step": args.fault_step,
             "inner_steps": args.inner_steps, "timeout_s": args.timeout_s, "runs_dir": args.runs_dir}
            for a in args.algorithms for s in range(args.seeds) for f in args.faults]
    h = Harness(args.name, __file__, vars(args), allow_dirty=args.allow_dirty)
    results = h.run_jobs(jobs, run_job)
    paths = h.write(summarise(jobs, results), text)
    print(paths["txt"].read_text())


if __name__ == "__main__":
    main()
