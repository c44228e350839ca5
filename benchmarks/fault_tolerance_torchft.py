"""fault_tolerance_torchft: what a killed worker costs DDP and DiLoCo with `transport=torchft`
(its replica group alone restarts and heals from a live one) beside today's whole-group restart.

Every run is the ordinary recipe on loopback with two workers of one rank, 8 sequences per worker
and step, `launcher.max_restarts=1`:

  ft_none        2 torchft replica groups, a lighthouse started by the recipe; no fault (the reference)
  ft_kill        the same; once group 0 has logged `--fault-step` steps, SIGKILL group 1's worker.
                 torchrun restarts that group alone; it heals from group 0 at its first quorum.
                 A busy stand-in process holds the dead worker's share of the cores from the kill
                 until its replacement process exists (on separate machines the survivor would not
                 get that CPU; fault_tolerance.py does the same for NoLoCo)
  group_none     one collective job of 2 ranks (transport=torch), checkpoint every
                 `--checkpoint-every` steps; no fault
  group_restart  the same; SIGKILL rank 1 at `--fault-step`: torchrun restarts both ranks, which resume
                 from the newest checkpoint (today's path for DDP/DiLoCo)

Figures per run (worker 0 is the survivor): its steps/min over its own training window (first to
last logged step: start-up excluded, every stall included) against the no-fault run of the same
kind and seed; steps rolled back (torchft: a logged step lower than one before; whole group: the
survivor's step at the kill minus the step it resumed from); work lost (DDP: steps dropped by a
failed commit; DiLoCo: syncs not committed); seconds from the kill to the first step the restarted
worker contributes to (torchft: its first row with `ft/participants` = 2; whole group: the first
step after the restart), split into the restart itself (kill -> the replacement's trainer is
built, read from its train.log) and what torchft adds (built -> contributing); whether its first
quorum already counted both groups; syncs after the heal where the groups' global state differed
(`ft/global_sum`, DiLoCo) or a quorum had one group only; bit-equal final weights.

Departures from torchft's measurements: one shared, loaded 2-core machine; one seed unless asked;
a tiny model and few steps; loopback only (no emulated WAN: the WAN rows of fault_tolerance.py are
gossip's).

    python -m benchmarks.fault_tolerance_torchft --steps 160 --fault-step 40 --seeds 1   # ~30 min on 2 loaded cores
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.common import elastic_pid, stand_in
from benchmarks.harness import Harness, bench_parser, fmt, header, mean_std, own_flags, parse, read_live_jsonl

ROOT = Path(__file__).resolve().parents[1]
MODES = ("ft_none", "ft_kill", "group_none", "group_restart")
BASE = {"ft_kill": "ft_none", "group_restart": "group_none"}
PER_WORKER_BATCH = 8


# -- pure figures from metrics rows -------------------------------------------------------
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


def unequal_syncs(a: list[dict], b: list[dict], after: float) -> int:
    """Committed syncs after `after` at which the two groups logged different global-state sums."""

    def sums(rows):
        return {
            r["ft/committed_steps"]: r["ft/global_sum"]
            for r in train_rows(rows)
            if r["time"] >= after and r.get("ft/global_sum") is not None
        }

    sa, sb = sums(a), sums(b)
    return sum(sa[k] != sb[k] for k in set(sa) & set(sb))


def ready_times(log: Path) -> list[float]:
    """Epoch seconds of each "[decentrain] <algo>: ..." start line in a train.log (one per attempt)."""
    if not log.exists():
        return []
    out = []
    for line in log.read_text().splitlines():
        if "[decentrain] " in line and (" from scratch;" in line or " resumed from step " in line):
            out.append(datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return out


def model_digest(run_dir: Path) -> str | None:
    files = sorted((run_dir / "model").glob("*.safetensors"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


# -- one run --------------------------------------------------------------------------------
def overrides(job: dict, run_dir: Path) -> list[str]:
    ft = job["mode"].startswith("ft")
    args = [
        f"experiment={job['algorithm']}_cpu",
        f"train.steps={job['steps']}",
        f"train.micro_batch_size={PER_WORKER_BATCH}",
        "logger.log_every=1",
        "train.eval_every=100000",
        f"train.seed={job['seed']}",
        f"run_dir={run_dir}",
        "logger.progress=false",
        "launcher.max_restarts=1",
        "train.threads=1",
    ]
    if job["algorithm"] == "diloco":
        args.append(f"algorithm.inner_steps={job['inner_steps']}")
    if ft:  # train.global_batch_size is per replica group
        return [
            *args,
            "transport=torchft",
            "transport.replicas=2",
            "launcher.nproc_per_node=1",
            f"train.global_batch_size={PER_WORKER_BATCH}",
            "train.checkpoint_every=100000",
        ]
    return [
        *args,
        "launcher.nproc_per_node=2",
        f"train.global_batch_size={2 * PER_WORKER_BATCH}",
        f"train.checkpoint_every={job['checkpoint_every']}",
    ]


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def run_job(job: dict[str, Any]) -> dict[str, Any]:
    mode, ft = job["mode"], job["mode"].startswith("ft")
    run_dir = Path(job["runs_dir"]) / f"{job['algorithm']}_{mode}_s{job['seed']}"
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RUST_LOG": "warn", "OMP_NUM_THREADS": "1", "DECENTRAIN_BENCH": token}
    survivor_dir, other_dir = (run_dir / "replica_0", run_dir / "replica_1") if ft else (run_dir, run_dir)
    with open(run_dir.parent / f"{run_dir.name}.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "recipes.train", *overrides(job, run_dir)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        events: dict[str, float] = {}
        victim, burner = None, None
        deadline = time.time() + job["timeout_s"]
        try:
            while proc.poll() is None and time.time() < deadline:
                time.sleep(0.1)
                if mode in BASE and "killed_at" not in events:
                    rows = train_rows(read_live_jsonl(survivor_dir / "metrics.jsonl"))
                    if rows and rows[-1]["step"] >= job["fault_step"]:
                        if ft:
                            agent = int(json.loads((run_dir / "replicas.json").read_text())["torchrun"]["1"])
                            victim = (children(agent) or [None])[0]
                        else:
                            victim = elastic_pid(token, 1)
                        if victim is not None:
                            os.kill(victim, signal.SIGKILL)
                            events["killed_at"], events["survivor_step_at_kill"] = time.time(), rows[-1]["step"]
                            burner = stand_in() if ft else None  # a whole-group restart stops every rank anyway
                elif burner is not None:
                    agent = int(json.loads((run_dir / "replicas.json").read_text())["torchrun"]["1"])
                    if [p for p in children(agent) if p != victim]:  # the replacement exists: it takes its cores back
                        burner.kill()
                        burner.wait()
                        burner, events["replacement_at"] = None, time.time()
        finally:
            if burner is not None:
                burner.kill()
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                return {"error": f"timed out after {job['timeout_s']} s", "events": events}
    survivor = read_live_jsonl(survivor_dir / "metrics.jsonl")
    last = train_rows(survivor)[-1] if train_rows(survivor) else {}
    out: dict[str, Any] = {
        "exit_code": proc.returncode,
        "events": events,
        "survivor_steps_per_min": steps_per_min(survivor),
        "survivor_final_step": last.get("step"),
    }
    if ft:
        other = read_live_jsonl(other_dir / "metrics.jsonl")
        out["survivor_rolled_back_steps"] = rolled_back(survivor)
        out["survivor_work_lost"] = last.get("ft/dropped_steps", last.get("ft/failed_syncs"))
        out["bit_equal_final_weights"] = model_digest(survivor_dir) is not None and model_digest(
            survivor_dir
        ) == model_digest(other_dir)
        after = events.get("killed_at", 0.0)
        out["unequal_global_syncs"] = unequal_syncs(survivor, other, after) if job["algorithm"] == "diloco" else None
        out["one_group_quorums_after_heal"] = None
    if "killed_at" in events:
        killed = events["killed_at"]
        ready = [t for t in ready_times((other_dir if ft else run_dir) / "train.log") if t > killed]
        out["kill_to_ready_s"] = ready[0] - killed if ready else None
        if ft:
            back = [r for r in train_rows(other) if r["time"] > killed and (r.get("ft/participants") or 0) >= 1]
            joined = [r for r in back if r["ft/participants"] == 2.0]
            out["first_quorum_had_both"] = bool(back) and back[0]["ft/participants"] == 2.0
            if joined:
                out["one_group_quorums_after_heal"] = sum(
                    1
                    for rows in (survivor, other)
                    for r in train_rows(rows)
                    if r["time"] > joined[0]["time"] and r.get("ft/participants") == 1.0
                )
            first = joined[0] if joined else None
        else:
            log = (run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else ""
            resumed = int(log.rsplit("resumed from step ", 1)[1].split(";")[0]) if "resumed from step " in log else 0
            out["resumed_from"] = resumed
            out["survivor_rolled_back_steps"] = out["survivor_work_lost"] = (
                int(events["survivor_step_at_kill"]) - resumed
            )
            first = next((r for r in train_rows(survivor) if r["time"] > killed), None)
        out["kill_to_contributing_s"] = first["time"] - killed if first else None
        out["ready_to_contributing_s"] = first["time"] - ready[0] if first and ready else None
        out["contributing_step"] = first["step"] if first else None
    return out


# -- summary --------------------------------------------------------------------------------
def _ms(values: list) -> dict[str, Any] | None:
    values = [v for v in values if v is not None]
    return mean_std(values) if values else None


def summarise(jobs: list[dict], results: list[dict]) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    for algorithm in dict.fromkeys(j["algorithm"] for j in jobs):
        runs = {
            m: {j["seed"]: r for j, r in zip(jobs, results) if j["algorithm"] == algorithm and j["mode"] == m}
            for m in MODES
        }
        rows: dict[str, Any] = {}
        for fault, base in BASE.items():
            if not runs[fault]:
                continue
            ratio = [
                r["survivor_steps_per_min"] / runs[base][s]["survivor_steps_per_min"]
                for s, r in runs[fault].items()
                if r.get("survivor_steps_per_min") and (runs[base].get(s) or {}).get("survivor_steps_per_min")
            ]
            kills = list(runs[fault].values())
            rows[fault] = {
                "survivor_rate_vs_no_fault": _ms(ratio),
                "rolled_back_steps": [k.get("survivor_rolled_back_steps") for k in kills],
                "work_lost": [k.get("survivor_work_lost") for k in kills],
                "kill_to_contributing_s": _ms([k.get("kill_to_contributing_s") for k in kills]),
                "kill_to_ready_s": _ms([k.get("kill_to_ready_s") for k in kills]),
                "ready_to_contributing_s": _ms([k.get("ready_to_contributing_s") for k in kills]),
            }
            if fault == "ft_kill":
                rows[fault].update(
                    {
                        "first_quorum_had_both": [k.get("first_quorum_had_both") for k in kills],
                        "unequal_global_syncs": [k.get("unequal_global_syncs") for k in kills],
                        "one_group_quorums_after_heal": [k.get("one_group_quorums_after_heal") for k in kills],
                        "bit_equal_final_weights": [k.get("bit_equal_final_weights") for k in kills],
                        "targets": {
                            "survivor_rate>=0.9": bool(ratio) and min(ratio) >= 0.9,
                            "rolled_back==0": all(k.get("survivor_rolled_back_steps") == 0 for k in kills),
                            "bit_equal_after_heal": bool(kills)
                            and all(k.get("bit_equal_final_weights") for k in kills),
                        },
                    }
                )
        figures[algorithm] = {
            "rows": rows,
            "runs": {m: {str(s): r for s, r in v.items()} for m, v in runs.items() if v},
        }
    return figures


def _f(ms: dict | None, digits: int = 3) -> str:
    return fmt(ms, digits) if ms else "n/a"


def text(rec: dict) -> str:
    c = rec["config"]
    lines = [
        header(rec),
        "",
        f"2 workers x 1 rank, {PER_WORKER_BATCH} seqs each per step, loopback; {c['steps']} steps, SIGKILL worker "
        f"1 at worker 0's step {c['fault_step']}; DiLoCo H={c['inner_steps']}; whole group checkpoints every "
        f"{c['checkpoint_every']} steps; {c['seeds']} seed(s). ft_kill: torchft, group 1 restarts alone and heals; "
        "group_restart: both ranks restart from the newest checkpoint. rate = survivor's steps/min over its own "
        "window vs the no-fault run of the same kind.",
        "",
        f"{'algorithm/scenario':24} {'rate vs none':>14} {'rolled back':>12} {'work lost':>10} {'kill->contrib s':>16} "
        f"{'kill->ready s':>14} {'ready->contrib s':>17}",
    ]
    for algorithm, f in rec["figures"].items():
        for fault, r in f["rows"].items():
            lines.append(
                f"{algorithm + '/' + fault:24} {_f(r['survivor_rate_vs_no_fault']):>14} "
                f"{str(r['rolled_back_steps']):>12} {str(r['work_lost']):>10} "
                f"{_f(r['kill_to_contributing_s'], 1):>16} {_f(r['kill_to_ready_s'], 1):>14} "
                f"{_f(r['ready_to_contributing_s'], 1):>17}"
            )
            if fault == "ft_kill":
                lines.append(
                    f"{'':24} first quorum had both groups {r['first_quorum_had_both']}; unequal global syncs "
                    f"{r['unequal_global_syncs']}; one-group quorums after heal {r['one_group_quorums_after_heal']}; "
                    f"bit-equal final weights {r['bit_equal_final_weights']}; targets {r['targets']}"
                )
    lines.append("")
    for algorithm, f in rec["figures"].items():
        for mode, by_seed in f["runs"].items():
            for seed, run in by_seed.items():
                lines.append(f"run {algorithm}/{mode}/s{seed}: {json.dumps(run)}")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = bench_parser(__doc__, seeds=1)
    ap.add_argument("--algorithms", nargs="+", default=["ddp", "diloco"], choices=["ddp", "diloco"])
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--steps", type=int, default=160)
    ap.add_argument("--fault-step", type=int, default=40)  # after the whole group's first checkpoint
    ap.add_argument("--inner-steps", type=int, default=5)
    ap.add_argument("--checkpoint-every", type=int, default=25)
    ap.add_argument("--timeout-s", type=float, default=1200)
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "fault_tolerance_torchft"))
    ap.add_argument("--name", default="fault_tolerance_torchft")
    args = parse(ap)
    jobs = [
        {
            "algorithm": a,
            "mode": m,
            "seed": s,
            "steps": args.steps,
            "fault_step": args.fault_step,
            "inner_steps": args.inner_steps,
            "checkpoint_every": args.checkpoint_every,
            "timeout_s": args.timeout_s,
            "runs_dir": args.runs_dir,
        }
        for a in args.algorithms
        for s in range(args.seeds)
        for m in args.modes
    ]
    config = own_flags(args)
    h = Harness(args.name, __file__, config, allow_dirty=args.allow_dirty, fresh=args.fresh, smoke=args.smoke)
    results = h.run_jobs(jobs, run_job)
    paths = h.write(summarise(jobs, results), text)
    print(paths["txt"].read_text())


if __name__ == "__main__":
    main()
