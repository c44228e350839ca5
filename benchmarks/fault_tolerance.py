"""fault_tolerance: what a dead, stopped, cut-off or replaced worker costs NoLoCo (gossip), and
DiLoCo/DDP (collective) for contrast, as torchft measures it.

Every run is the ordinary pre-training recipe with 4 gloo workers; one fault hits rank 2 once
rank 0 has logged `--fault-step` steps. Links: `loopback` (the recipe's own launcher) and
`wan` (one network namespace per worker from launch/wan_emulation.sh, tbf-capped uplinks and
a delay line, prefix `ft`; the workers get torchrun's environment from this script, the c10d
store lives in the bridge namespace).

  noloco/none       no fault: the reference
  noloco/kill       SIGKILL rank 2; a CPU stand-in (one busy process) takes its place on the
                    cores, because on one shared machine a dead worker hands its CPU to the
                    survivors, which would not happen on separate machines (the control)
  noloco/kill_raw   SIGKILL without the stand-in (loopback only): the confounded figure
  noloco/stop       SIGSTOP rank 2 for `--stop-s` s (stand-in meanwhile), then SIGCONT
  noloco/partition  (wan) drop every packet in and out of rank 2's namespace for `--partition-s` s
  noloco/replace    SIGKILL rank 2 with launcher.max_restarts=1: a replacement heals from a live peer
                    (only where launch_survivors takes max_restarts)
  diloco|ddp/none, diloco|ddp/kill   kill rank 2 under launcher.max_restarts=1 (a hand re-run if
                    that fails); the resumed losses must equal the no-fault run's bit for bit

Figures (NoLoCo, per seed, then mean ± std over seeds): survivors' steps/min over their own
training window (first to last logged step, so start-up is excluded) against the same ranks of
the no-fault run; their compute ms/step (median perf/step_ms of steps without an outer sync);
rounds lost beyond the pairings with the faulty rank while it is out; rounds and seconds until
the faulty (or replacement) rank averages again after the fault ends; final eval loss against
the no-fault run.

    python -m benchmarks.fault_tolerance --delay-python /tmp/ftnfq/bin/python      # as root (~45 min on 2 loaded cores)
    python -m benchmarks.fault_tolerance --links loopback --steps 200 --seeds 1 --allow-dirty   # smoke
"""

from __future__ import annotations

import argparse
import atexit
import inspect
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import elastic_pid, stand_in
from benchmarks.harness import Harness, bench_parser, fmt, header, mean_std, parse, read_live_jsonl, save_figure
from decentrain.core.metrics import metrics_file

ROOT = Path(__file__).resolve().parents[1]
WAN = ROOT / "launch" / "wan_emulation.sh"
PREFIX = "ft"  # own namespaces (another benchmark uses others)
STORE_ADDR = "10.77.0.254"  # the c10d store, on the bridge inside `ftbr`
FAULTY, WORLD = 2, 4
NOLOCO_FAULTS = {"loopback": ("kill", "kill_raw", "stop", "replace"), "wan": ("kill", "stop", "partition")}
THROUGHPUT_FAULTS = ("kill", "stop", "partition", "replace")  # kill_raw is confounded: reported, not a target


# -- pure figures from metrics rows -------------------------------------------------------
def pairings_with(rank: int, faulty: int, rounds: int, seed: int = 0) -> set[int]:
    from decentrain.core.comm.pairing import gossip_groups, group_of

    return {t for t in range(rounds) if faulty in group_of(rank, gossip_groups(t, WORLD, seed))}


def rank_figures(rows: list[dict], fault_at: float | None = None) -> dict[str, Any] | None:
    """One rank's figures from its metrics rows (None when it logged fewer than 2 steps)."""
    train = [r for r in rows if "train/loss" in r]
    if len(train) < 2:
        return None
    window = train[-1]["time"] - train[0]["time"]
    outer = [r for r in rows if "outer/round" in r]
    compute = [r["perf/step_ms"] for r in train if "perf/step_ms" in r and "outer/round" not in r]
    after = [
        r["perf/step_ms"]
        for r in train
        if "perf/step_ms" in r and "outer/round" not in r and fault_at and r["time"] >= fault_at
    ]
    evals = [r["eval/loss"] for r in rows if "eval/loss" in r]
    tail = [r["train/loss"] for r in train[-max(1, len(train) // 20) :]]
    return {
        "steps": train[-1]["step"],
        "window_s": window,
        "steps_per_min": 60 * (len(train) - 1) / window if window > 0 else None,
        "compute_ms": statistics.median(compute) if compute else None,
        "compute_ms_after_fault": statistics.median(after) if after else None,
        "final_eval_loss": evals[-1] if evals else None,
        "final_train_loss_tail": statistics.fmean(tail),
        "rounds": [(int(r["outer/round"]) - 1, r["time"], bool(r.get("outer/partner_missed", 0))) for r in outer],
        "heal": {k: r[k] for r in rows for k in ("heal/seconds", "heal/from_rank") if k in r},
        "finished": bool(evals),  # the final evaluation ran (a rank that jumped rounds to catch up ends early)
        "rounds_jumped": sum(int(r.get("outer/rounds_jumped", 0)) for r in outer),
    }


def rejoin(faulty: dict | None, back_at: float | None) -> dict[str, Any]:
    """Rounds (the faulty rank's own, counted from `back_at`) and seconds until it averages again."""
    if not faulty or back_at is None:
        return {"round": None, "rounds": None, "seconds": None}
    after = [(t, when, missed) for t, when, missed in faulty["rounds"] if when >= back_at]
    for n, (t, when, missed) in enumerate(after, 1):
        if not missed:
            return {"round": t, "rounds": n, "seconds": when - back_at}
    return {"round": None, "rounds": None, "seconds": None}


def rounds_lost(
    survivor: dict, rank: int, fault_at: float | None, rejoin_round: int | None, pairing_seed: int = 0
) -> dict[str, int]:
    """A survivor's missed rounds, split: paired with the faulty rank while it was out (unavoidable,
    one per affected pair and round) and every other one (`beyond`: the fault's spill-over)."""
    rounds = survivor["rounds"]
    with_faulty = pairings_with(rank, FAULTY, (max((t for t, _, _ in rounds), default=-1) + 1), pairing_seed)
    first = next((t for t, when, _ in rounds if fault_at is not None and when >= fault_at), None)
    out = {"with_faulty": 0, "beyond": 0}
    for t, _, missed in rounds:
        if not missed:
            continue
        expected = first is not None and t >= first and t in with_faulty and (rejoin_round is None or t < rejoin_round)
        out["with_faulty" if expected else "beyond"] += 1
    return out


def run_figures(
    per_rank: dict[int, dict | None], events: dict[str, float], fault: str, pairing_seed: int = 0
) -> dict[str, Any]:
    """Survivors' figures of one run, and the faulty rank's rejoin."""
    back_at = events.get("back_at")  # SIGCONT, link restored, or the replacement's kill time
    rj = rejoin(per_rank.get(FAULTY), back_at) if fault in ("stop", "partition", "replace") else {}
    survivors = {}
    for rank, fig in per_rank.items():
        if rank == FAULTY or fig is None:
            continue
        lost = (
            rounds_lost(
                fig,
                rank,
                events.get("fault_at"),
                rj.get("round") if fault in ("stop", "partition", "replace") else None,
                pairing_seed,
            )
            if fault != "none"
            else {"with_faulty": 0, "beyond": sum(m for _, _, m in fig["rounds"])}
        )
        survivors[str(rank)] = {k: v for k, v in fig.items() if k != "rounds"} | {
            "rounds_lost": lost,
            "rounds": len(fig["rounds"]),
        }
    faulty = per_rank.get(FAULTY)
    return {
        "survivors": survivors,
        "rejoin": rj,
        "faulty": {k: v for k, v in faulty.items() if k != "rounds"} if faulty else None,
    }


def ratios(run: dict, base: dict, key: str) -> float | None:
    """Mean over the survivors of run/base for one figure (same ranks, same seed)."""
    vals = [
        run["survivors"][r][key] / base["survivors"][r][key]
        for r in run["survivors"]
        if r in base["survivors"] and run["survivors"][r].get(key) and base["survivors"][r].get(key)
    ]
    return statistics.fmean(vals) if vals else None


def target(checks: dict[str, Any], ok) -> dict[str, Any]:
    """{met, checked, failed}: a target is met only when every scenario it covers passes."""
    failed = {name: v for name, v in checks.items() if not ok(v)}
    return {"met": (not failed) if checks else None, "checked": sorted(checks), "failed": failed}


# -- running one scenario -----------------------------------------------------------------
def overrides(job: dict, run_dir: Path) -> list[str]:
    algo, steps = job["algorithm"], job["steps"]
    out = [
        f"algorithm={algo}",
        f"launcher.nproc_per_node={WORLD}",
        f"train.steps={steps}",
        "model.hidden_size=32",
        "model.num_layers=2",
        "model.num_heads=2",
        "model.intermediate_size=64",
        "data.seq_len=32",
        "data.max_bytes_per_domain=20000",
        "data.domains=[python_docs,licenses]",
        "train.global_batch_size=8",
        "train.micro_batch_size=2",
        f"train.eval_batches={job['eval_batches']}",
        f"train.eval_every={steps}",
        f"train.checkpoint_every={job['checkpoint_every']}",
        f"train.seed={job['seed']}",
        "train.threads=1",
        "train.device=cpu",
        "logger.progress=false",
        "logger.log_every=1",
        "logger.all_ranks=true",
        f"run_dir={run_dir}",
        "resume=true",
    ]  # a fresh run_dir each time; a restart must resume
    if algo != "ddp":
        out.append(f"algorithm.inner_steps={job['inner_steps']}")
    if algo == "noloco":
        out.append(f"algorithm.deadline_s={job['deadline_s']}")
    if job["fault"] == "replace" or (algo != "noloco" and job["fault"] == "kill"):
        out.append("launcher.max_restarts=1")
    return out


class Wan:
    """Emulated WAN for one run: namespaces up, a c10d store in the bridge namespace, always torn down."""

    def __init__(self, job: dict):
        self.job, self.env = job, {**os.environ, "WAN_PREFIX": PREFIX, "PYTHON": job["delay_python"]}
        self.store: subprocess.Popen | None = None

    def sh(self, *cmd: str, check: bool = True) -> None:
        subprocess.run(list(cmd), check=check, env=self.env, stdout=subprocess.DEVNULL)

    def __enter__(self) -> "Wan":
        if Path(f"/run/decentrain-wan-{PREFIX}").exists():  # our own leftovers from a killed run
            self.sh(str(WAN), "down", check=False)
        atexit.register(self.__exit__)
        self.sh(str(WAN), "up", str(WORLD), self.job["rate"], str(self.job["delay_ms"]))
        self.sh("ip", "-n", f"{PREFIX}br", "addr", "add", f"{STORE_ADDR}/24", "dev", "br0")
        for r in range(WORLD):  # long-lived training links: no slow-start restart after each idle compute phase
            self.sh("ip", "netns", "exec", f"{PREFIX}{r}", "sysctl", "-qw", "net.ipv4.tcp_slow_start_after_idle=0")
        code = (
            f"import sys, time; from torch.distributed import TCPStore; s = TCPStore({STORE_ADDR!r}, 29500, "
            "is_master=True, wait_for_workers=False); print('ready', flush=True); time.sleep(1e6)"
        )
        self.store = subprocess.Popen(
            ["ip", "netns", "exec", f"{PREFIX}br", sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        if self.store.stdout.readline().strip() != "ready":
            raise RuntimeError("the c10d store in the bridge namespace did not start")
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.store and self.store.poll() is None:
            os.killpg(self.store.pid, signal.SIGKILL)
            self.store.wait()
        self.store = None
        self.sh(str(WAN), "down", check=False)

    def start(self, job: dict, run_dir: Path, env: dict) -> dict[int, subprocess.Popen]:
        run_id = uuid.uuid4().hex[:12]
        argv = [*overrides(job, run_dir), f"hydra.run.dir={run_dir}"]
        procs = {}
        for r in range(WORLD):
            wenv = {
                **env,
                "MASTER_ADDR": STORE_ADDR,
                "MASTER_PORT": "29500",
                "RANK": str(r),
                "WORLD_SIZE": str(WORLD),
                "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1",
                "GROUP_RANK": str(r),
                "TORCHELASTIC_RUN_ID": run_id,
                "TORCHELASTIC_USE_AGENT_STORE": "True",
                "TORCHELASTIC_RESTART_COUNT": "0",
                "GLOO_SOCKET_IFNAME": "eth0",
            }
            procs[r] = subprocess.Popen(
                ["ip", "netns", "exec", f"{PREFIX}{r}", sys.executable, "-u", "-m", "recipes.train", *argv],
                cwd=ROOT,
                env=wenv,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
        return procs

    def partition(self, rank: int, on: bool) -> None:
        ns, op = f"{PREFIX}{rank}", "-I" if on else "-D"
        for chain, flag in (("INPUT", "-i"), ("OUTPUT", "-o")):  # a silent outage: TCP retransmits, nothing resets
            self.sh(
                "ip", "netns", "exec", ns, "iptables", op, chain, *(["1"] if on else []), flag, "eth0", "-j", "DROP"
            )


def metrics_rows(run_dir: Path, rank: int) -> list[dict]:
    return read_live_jsonl(run_dir / metrics_file(rank))


def inject(job: dict, run_dir: Path, alive, pid_of, wan: Wan | None) -> dict[str, float]:
    """Wait for rank 0's `fault_step`, then hit rank 2; returns the event times (epoch seconds, as the metrics)."""
    events: dict[str, float] = {}
    fault = job["fault"]
    while alive() and not any(r.get("step", 0) >= job["fault_step"] for r in metrics_rows(run_dir, 0)):
        time.sleep(0.05)
    if not alive():
        return events
    burner = None
    if fault == "partition":
        events["fault_at"] = time.time()
        wan.partition(FAULTY, True)
        time.sleep(job["partition_s"])
        wan.partition(FAULTY, False)
        events["back_at"] = time.time()
        return events
    pid = pid_of()
    events["fault_at"] = time.time()
    if fault == "stop":
        os.kill(pid, signal.SIGSTOP)
        burner = stand_in()
        time.sleep(job["stop_s"])
        burner.kill()
        burner.wait()
        os.kill(pid, signal.SIGCONT)
        events["back_at"] = time.time()
        return events
    os.kill(pid, signal.SIGKILL)
    if fault == "replace":
        events["back_at"] = events["fault_at"]
    elif fault == "kill" and job["algorithm"] == "noloco":
        events["stand_in_pid"] = stand_in().pid  # killed with the run (see run_job)
    return events


def run_job(job: dict) -> dict[str, Any]:
    """One scenario, start to finish; returns its figures (cached by the harness)."""
    run_dir = Path(job["runs_dir"]) / f"seed{job['seed']}" / job["link"] / job["algorithm"] / job["fault"]
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    token = uuid.uuid4().hex
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "DECENTRAIN_BENCH": token}
    t0, deadline = time.time(), time.time() + job["run_timeout_s"]
    wan = Wan(job) if job["link"] == "wan" else None
    procs: dict[int, subprocess.Popen] = {}
    events: dict[str, float] = {}
    out: dict[str, Any] = {}
    try:
        if wan:
            wan.__enter__()
            procs = wan.start(job, run_dir, env)
            alive = lambda: all(p.poll() is None for p in procs.values())  # noqa: E731
            pid_of = lambda: procs[FAULTY].pid  # noqa: E731  (ip netns exec execs the worker in place)
        else:
            procs[-1] = subprocess.Popen(
                [sys.executable, "-m", "recipes.train", *overrides(job, run_dir)],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
            alive = lambda: procs[-1].poll() is None  # noqa: E731

            def pid_of() -> int | None:
                if (run_dir / "workers.json").exists():  # launch_survivors (gossip)
                    return int(json.loads((run_dir / "workers.json").read_text())[str(FAULTY)])
                return elastic_pid(token, FAULTY)

        if job["fault"] != "none":
            events = inject(job, run_dir, alive, pid_of, wan)
        if wan:
            codes = {r: p.wait(timeout=max(1, deadline - time.time())) for r, p in procs.items()}
            out["exit_codes"], out["returncode"] = codes, max(codes.values(), key=abs)
            out["tail"] = {r: p.stderr.read()[-800:] for r, p in procs.items() if codes[r]}
        else:
            text, _ = procs[-1].communicate(timeout=max(1, deadline - time.time()))
            out["returncode"], out["tail"] = procs[-1].returncode, text[-1500:]
    finally:
        if "stand_in_pid" in events:
            os.kill(int(events.pop("stand_in_pid")), signal.SIGKILL)
        for p in procs.values():  # each worker (or the launcher with its workers) in its own session
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if wan:
            wan.__exit__()
    out["wall_s"], out["events"] = time.time() - t0, events
    if job["algorithm"] != "noloco" and job["fault"] == "kill":
        out["recovered_by"] = "max_restarts" if out["returncode"] == 0 else None
        if out["returncode"] != 0:  # the documented fallback: the same command again resumes from the newest good step
            rerun = subprocess.run(
                [sys.executable, "-m", "recipes.train", *overrides({**job, "fault": "none"}, run_dir)],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=job["run_timeout_s"],
            )
            out["rerun_returncode"], out["recovered_by"] = rerun.returncode, "rerun" if rerun.returncode == 0 else None
    per_rank = {r: rank_figures(metrics_rows(run_dir, r), events.get("fault_at")) for r in range(WORLD)}
    if job["algorithm"] == "noloco":
        out.update(run_figures(per_rank, events, job["fault"]))
        out["series"] = {
            str(r): thin([(x["time"], x["step"]) for x in metrics_rows(run_dir, r) if "train/loss" in x])
            for r in range(WORLD)
        }
    else:
        out["losses"] = [[x["step"], x["train/loss"]] for x in metrics_rows(run_dir, 0) if "train/loss" in x]
        out["final_eval_loss"] = (per_rank[0] or {}).get("final_eval_loss")
        log = (run_dir / "train.log").read_text() if (run_dir / "train.log").exists() else ""
        out["resumed_from"] = (
            int(log.rsplit("resumed from step ", 1)[1].split(";")[0]) if "resumed from step " in log else None
        )
    return out


def thin(points: list[tuple[float, int]], n: int = 80) -> list[tuple[float, int]]:
    return points if len(points) <= n else [points[i * (len(points) - 1) // (n - 1)] for i in range(n)]


# -- the benchmark ------------------------------------------------------------------------
def replace_supported() -> bool:
    from decentrain.core.launch.launcher import launch_survivors

    return "max_restarts" in inspect.signature(launch_survivors).parameters


def ms(values: list) -> dict[str, Any] | None:
    vals = [v for v in values if v is not None]
    return mean_std(vals) if vals else None


def summarise(jobs: list[dict], results: list[dict], args: argparse.Namespace) -> dict[str, Any]:
    by = {(j["link"], j["algorithm"], j["fault"], j["seed"]): r for j, r in zip(jobs, results)}
    scen: dict[str, Any] = {}
    for link, algo, fault in dict.fromkeys((j["link"], j["algorithm"], j["fault"]) for j in jobs):
        runs = [
            (s, by[link, algo, fault, s], by.get((link, algo, "none", s)))
            for s in range(max(args.seeds, args.wan_seeds))
            if (link, algo, fault, s) in by
        ]
        name = f"{link}/{algo}/{fault}"
        steps = args.collective_steps if algo != "noloco" else args.wan_steps if link == "wan" else args.steps
        row: dict[str, Any] = {
            "returncode": [r["returncode"] for _, r, _ in runs],
            "wall_s": ms([r["wall_s"] for _, r, _ in runs]),
        }
        if algo == "noloco":
            row["training_window_s"] = ms(
                [statistics.fmean(v["window_s"] for v in r["survivors"].values()) for _, r, _ in runs]
            )
            row["survivor_steps_per_min"] = ms(
                [statistics.fmean(v["steps_per_min"] for v in r["survivors"].values()) for _, r, _ in runs]
            )
            row["survivors_finished"] = [sum(v["finished"] for v in r["survivors"].values()) for _, r, _ in runs]
            row["survivor_rounds_jumped"] = [
                sum(v["rounds_jumped"] for v in r["survivors"].values()) for _, r, _ in runs
            ]
            if fault == "none":  # no fault, yet missed rounds: late partners on the loaded cores
                row["rounds_missed"] = [
                    sum(v["rounds_lost"]["beyond"] for v in r["survivors"].values()) for _, r, _ in runs
                ]
            if fault != "none":
                row["throughput_ratio"] = ms([ratios(r, b, "steps_per_min") for _, r, b in runs])
                row["compute_ms_ratio_after_fault"] = ms(
                    [
                        statistics.fmean(
                            v["compute_ms_after_fault"] / b["survivors"][k]["compute_ms"]
                            for k, v in r["survivors"].items()
                            if v.get("compute_ms_after_fault") and b["survivors"].get(k, {}).get("compute_ms")
                        )
                        for _, r, b in runs
                    ]
                )
                row["final_eval_loss_ratio"] = ms([ratios(r, b, "final_eval_loss") for _, r, b in runs])
                row["rounds_lost_with_faulty"] = [
                    sum(v["rounds_lost"]["with_faulty"] for v in r["survivors"].values()) for _, r, _ in runs
                ]
                row["rounds_lost_beyond"] = [
                    sum(v["rounds_lost"]["beyond"] for v in r["survivors"].values()) for _, r, _ in runs
                ]
                if fault in ("stop", "partition", "replace"):
                    row["rejoin_rounds"] = [r["rejoin"].get("rounds") for _, r, _ in runs]
                    row["rejoin_seconds"] = ms([r["rejoin"].get("seconds") for _, r, _ in runs])
                    row["faulty_final_eval_loss_ratio"] = ms(
                        [
                            (r["faulty"] or {}).get("final_eval_loss", 0)
                            / (b["faulty"] or {}).get("final_eval_loss", 1)
                            if (r["faulty"] or {}).get("final_eval_loss") and (b["faulty"] or {}).get("final_eval_loss")
                            else None
                            for _, r, b in runs
                        ]
                    )
                if fault == "replace":
                    row["heal"] = [(r["faulty"] or {}).get("heal") for _, r, _ in runs]
        elif fault == "kill":
            row["recovered_by"] = [r.get("recovered_by") for _, r, _ in runs]
            row["resume_exact"] = [
                r["losses"] == b["losses"]
                and len(r["losses"]) == steps
                and r["final_eval_loss"] == b["final_eval_loss"]
                for _, r, b in runs
            ]
            row["resumed_from_step"] = [r.get("resumed_from") for _, r, _ in runs]
            row["first_differing_step"] = [
                next((x[0] for x, y in zip(r["losses"], b["losses"]) if x != y), None) for _, r, b in runs
            ]
            row["max_abs_train_loss_diff"] = [
                max((abs(x[1] - y[1]) for x, y in zip(r["losses"], b["losses"])), default=None) for _, r, b in runs
            ]
            row["wall_ratio_vs_no_fault"] = ms([r["wall_s"] / b["wall_s"] for _, r, b in runs])
        scen[name] = row
    nol = {n: v for n, v in scen.items() if "/noloco/" in n and not n.endswith("/none")}
    targets = {
        "noloco_survivors_ge_90pct_throughput": target(
            {
                n: (v["throughput_ratio"] or {}).get("mean")
                for n, v in nol.items()
                if n.split("/")[2] in THROUGHPUT_FAULTS
            },
            lambda x: x is not None and x >= 0.9,
        ),
        "at_most_one_round_per_affected_pair": target(
            {n: max(v["rounds_lost_beyond"]) for n, v in nol.items()}, lambda x: x == 0
        ),
        "rejoin_within_2_rounds": target(
            {
                n: (None if None in v["rejoin_rounds"] else max(v["rejoin_rounds"]))
                for n, v in nol.items()
                if "rejoin_rounds" in v
            },
            lambda x: x is not None and x <= 2,
        ),
        "collective_exact_resume": target(
            {n: all(v["resume_exact"]) for n, v in scen.items() if "resume_exact" in v}, bool
        ),
    }
    series = {
        f"{j['link']}/{j['fault']}": {"series": r["series"], "events": r["events"]}
        for j, r in zip(jobs, results)
        if j["algorithm"] == "noloco" and j["seed"] == 0
    }
    return {
        "scenarios": scen,
        "targets": targets,
        "series_seed0": series,
        "runs": {
            f"{j['link']}/{j['algorithm']}/{j['fault']}/seed{j['seed']}": {
                k: v for k, v in r.items() if k not in ("series", "losses")
            }
            for j, r in zip(jobs, results)
        },
    }


def main() -> None:
    ap = bench_parser(__doc__.splitlines()[0], smoke={"links": ["loopback"], "steps": 200, "seeds": 1})
    ap.add_argument("--links", nargs="*", default=["loopback", "wan"], choices=["loopback", "wan"])
    ap.add_argument(
        "--steps", type=int, default=1200, help="NoLoCo steps on loopback (>= 60 s of training without a fault)"
    )
    ap.add_argument("--wan-steps", type=int, default=800, help="NoLoCo steps on the emulated WAN (slower per step)")
    ap.add_argument("--wan-fault-step", type=int, default=200)
    ap.add_argument("--inner-steps", type=int, default=8)
    ap.add_argument("--fault-step", type=int, default=300)
    ap.add_argument("--stop-s", type=float, default=6.0)
    ap.add_argument("--partition-s", type=float, default=6.0)
    ap.add_argument("--deadline-s", type=float, default=3.0)
    ap.add_argument("--checkpoint-every", type=int, default=200)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument(
        "--faults",
        nargs="+",
        default=["kill", "kill_raw", "stop", "partition", "replace"],
        help="NoLoCo faults to run (each link runs those it supports); the no-fault reference always runs",
    )
    ap.add_argument("--wan-seeds", type=int, default=2, help="seeds of the WAN scenarios (0..S-1)")
    ap.add_argument("--raw-seeds", type=int, default=1, help="seeds of kill_raw (the confounded kill)")
    ap.add_argument("--collectives", nargs="*", default=["diloco", "ddp"], choices=["diloco", "ddp"])
    ap.add_argument("--collective-seeds", type=int, default=1, help="seeds of the DiLoCo/DDP exact-resume runs")
    ap.add_argument("--collective-steps", type=int, default=48)
    ap.add_argument("--collective-inner-steps", type=int, default=4)
    ap.add_argument("--collective-fault-step", type=int, default=20)
    ap.add_argument("--collective-checkpoint-every", type=int, default=8)
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--delay-ms", type=float, default=50.0)
    ap.add_argument(
        "--delay-python", default=sys.executable, help="a Python with NetfilterQueue, for the WAN delay line"
    )
    ap.add_argument("--run-timeout-s", type=float, default=900)
    ap.add_argument("--runs-dir", default=str(ROOT / "runs" / "fault_tolerance"))
    ap.add_argument("--name", default="fault_tolerance")
    args = parse(ap)
    if "wan" in args.links:
        if os.geteuid() != 0:
            ap.error("--links wan needs root (network namespaces)")
        if subprocess.run([args.delay_python, "-c", "import netfilterqueue"], capture_output=True).returncode:
            ap.error(f"--delay-python {args.delay_python} cannot import netfilterqueue (pip install NetfilterQueue)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the finally blocks: workers and namespaces go
    common = {
        k: getattr(args, k)
        for k in (
            "deadline_s",
            "stop_s",
            "partition_s",
            "eval_batches",
            "rate",
            "delay_ms",
            "delay_python",
            "run_timeout_s",
            "runs_dir",
        )
    }
    noloco = {
        "steps": args.steps,
        "inner_steps": args.inner_steps,
        "fault_step": args.fault_step,
        "checkpoint_every": args.checkpoint_every,
    }
    coll = {
        "steps": args.collective_steps,
        "inner_steps": args.collective_inner_steps,
        "fault_step": args.collective_fault_step,
        "checkpoint_every": args.collective_checkpoint_every,
    }
    with_replace = replace_supported()
    jobs = []
    seeds = {"loopback": args.seeds, "wan": args.wan_seeds}
    for seed in range(max(args.seeds, args.wan_seeds, args.collective_seeds)):
        for link in args.links:
            for fault in ("none", *NOLOCO_FAULTS[link]):
                if (
                    seed < seeds[link]
                    and (fault == "none" or fault in args.faults)
                    and (fault != "replace" or with_replace)
                    and (fault != "kill_raw" or seed < args.raw_seeds)
                ):
                    steps = {"steps": args.wan_steps, "fault_step": args.wan_fault_step} if link == "wan" else {}
                    jobs.append(
                        {**common, **noloco, **steps, "algorithm": "noloco", "link": link, "fault": fault, "seed": seed}
                    )
        for algo in args.collectives if seed < args.collective_seeds else ():
            jobs += [
                {**common, **coll, "algorithm": algo, "link": "loopback", "fault": f, "seed": seed}
                for f in ("none", "kill")
            ]
    config = {
        **vars(args),
        "world": WORLD,
        "faulty_rank": FAULTY,
        "replace_scenario": with_replace,
        "model": "llama hidden 32, 2 layers, seq 32, global batch 8 (4 ranks x 2)",
    }
    hz = Harness(args.name, __file__, config, allow_dirty=args.allow_dirty, fresh=args.fresh, smoke=args.smoke)
    results = hz.run_jobs(jobs, run_job, desc="scenarios")
    figures = summarise(jobs, results, args)
    if not with_replace:
        figures["replace_not_run"] = (
            "decentrain.core.launch.launcher.launch_survivors takes no max_restarts at this commit"
        )
    paths = hz.write(figures, text, plot)
    print(paths["txt"].read_text())


# -- JSON -> TXT / PNG ------------------------------------------------------------------
def _f(v: dict | None, digits: int = 3) -> str:
    return fmt(v, digits) if v else "-"


def text(rec: dict) -> str:
    c, f = rec["config"], rec["figures"]
    lines = [
        header(rec),
        f"wall time of this invocation: {rec['wall_s_this_invocation'] / 60:.1f} min",
        "",
        f"NoLoCo: {c['world']} workers, H={c['inner_steps']}, deadline {c['deadline_s']} s, fault on rank "
        f"{c['faulty_rank']}; stop {c['stop_s']} s, partition {c['partition_s']} s; mean ± std over seeds",
        f"  loopback: {c['steps']} steps, fault at rank 0's step {c['fault_step']}, {c['seeds']} seeds (kill_raw "
        f"{c['raw_seeds']}); wan: {c['wan_steps']} steps, fault at step {c['wan_fault_step']}, {c['wan_seeds']} seeds.",
        f"WAN: one netns per worker, uplink {c['rate']}, +{c['delay_ms']} ms each way. Collective: "
        f"{c['collective_steps']} steps, kill at step {c['collective_fault_step']}, checkpoint every "
        f"{c['collective_checkpoint_every']}, launcher.max_restarts=1, "
        f"{c['collective_seeds']} seed(s).",
        "steps/min: each survivor's own training window (first to last logged step; start-up excluded), ratio to "
        "the same",
        "rank of the no-fault run with the same seed, averaged over survivors. kill and stop put a busy stand-in "
        "process",
        "on the cores while rank 2 is out (on one shared machine its CPU would otherwise speed the survivors up);",
        "kill_raw has no stand-in and is confounded by that. compute ms = median perf/step_ms of steps without a sync.",
        "rounds lost: survivors' missed averaging rounds; `with faulty` = paired with rank 2 while it was out (one per",
        "affected pair and round, unavoidable); `beyond` = every other one. rejoin: rank 2's rounds (and seconds) from",
        "the fault's end (SIGCONT / link restored / kill for replace) to its first averaged round.",
        "",
    ]
    head = (
        f"{'scenario':26s} {'steps/min ratio':>16s} {'compute ms ratio':>17s} {'eval loss ratio':>16s} "
        f"{'lost beyond':>12s} {'with faulty':>12s} {'rejoin rounds':>14s} {'rejoin s':>14s} {'finished':>9s}"
    )
    lines.append(head)
    for n, v in f["scenarios"].items():
        if "/noloco/" not in n:
            continue
        if n.endswith("/none"):
            lines.append(
                f"{n:26s} {_f(v['survivor_steps_per_min'], 1):>16s} steps/min, training window "
                f"{_f(v['training_window_s'], 1)} s; no fault yet rounds missed {v['rounds_missed']}, jumped "
                f"{v['survivor_rounds_jumped']}; finished {v['survivors_finished']}"
            )
            continue
        lines.append(
            f"{n:26s} {_f(v['throughput_ratio']):>16s} {_f(v['compute_ms_ratio_after_fault']):>17s} "
            f"{_f(v['final_eval_loss_ratio']):>16s} {str(v['rounds_lost_beyond']):>12s} "
            f"{str(v['rounds_lost_with_faulty']):>12s} {str(v.get('rejoin_rounds', '-')):>14s} "
            f"{_f(v.get('rejoin_seconds'), 2):>14s} {str(v['survivors_finished']):>9s}"
        )
        if v.get("heal"):
            lines.append(f"{'':26s} replacement heal: {v['heal']}")
    for n, v in f["scenarios"].items():
        if "resume_exact" in v:
            lines.append(
                f"{n:26s} resume exact per seed {v['resume_exact']} (resumed from step {v['resumed_from_step']}; first "
                f"differing step {v['first_differing_step']}, max |train loss diff| "
                f"{v['max_abs_train_loss_diff']}), recovered by {v['recovered_by']}, wall vs no fault "
                f"{_f(v['wall_ratio_vs_no_fault'], 2)}, first return codes {v['returncode']}"
            )
    if f.get("replace_not_run"):
        lines.append(f"replace scenario not run: {f['replace_not_run']}")
    lines += ["", "targets:"]
    for k, t in f["targets"].items():
        lines.append(
            f"  {k}: {({True: 'MET', False: 'NOT MET', None: 'NOT CHECKED'})[t['met']]}  checked {t['checked']}"
            + (f"  failed {t['failed']}" if t["failed"] else "")
        )
    return "\n".join(lines)


def plot(rec: dict, png: Path) -> None:
    import matplotlib.pyplot as plt

    series = rec["figures"]["series_seed0"]
    links = sorted({k.split("/")[0] for k in series}) or ["no NoLoCo runs"]
    fig, axes = plt.subplots(1, len(links), figsize=(6.5 * len(links), 4.2), squeeze=False)
    for ax, link in zip(axes[0], links):
        for i, (key, s) in enumerate((k, v) for k, v in series.items() if k.startswith(link + "/")):
            t0 = s["series"]["0"][0][0] if s["series"].get("0") else 0
            for r in ("0", "1", "3"):
                pts = s["series"].get(r) or []
                ax.plot(
                    [p[0] - t0 for p in pts],
                    [p[1] for p in pts],
                    lw=1,
                    color=f"C{i}",
                    label=key.split("/")[1] if r == "0" else None,
                )
            if "fault_at" in s["events"]:
                ax.axvline(s["events"]["fault_at"] - t0, color=f"C{i}", lw=0.5, ls=":")
        ax.set(
            title=f"{link}: NoLoCo survivors (ranks 0, 1, 3), seed 0",
            xlabel="seconds since rank 0's first step",
            ylabel="step",
        )
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, png, dpi=120)


if __name__ == "__main__":
    main()
