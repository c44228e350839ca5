"""The README's Slurm commands against a real Slurm (opt-in: DECENTRAIN_SLURM_TESTS=1, root, slurm-wlm + munge).

One local cluster (slurmctld + two slurmd on this host, 4 declared CPUs each) serves the module.
Every job is submitted up front, so Slurm runs what fits side by side; each test then waits for
its own job and compares its metrics with the same run started locally with `decentrain`.
~15-25 min on a busy 2-core box.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from decentrain.testing import ROOT, LocalSlurm, missing_requirements, recipe_command

why_not = None if os.environ.get("DECENTRAIN_SLURM_TESTS") == "1" else "opt-in: set DECENTRAIN_SLURM_TESTS=1"
why_not = why_not or missing_requirements()
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(why_not is not None, reason=why_not or "")]

SBATCH = ["sbatch", "--nodes", "1", str(ROOT / "launch/slurm.sbatch")]
DDP = ["experiment=ddp_cpu", "train.steps=20"]
DDP4 = [*DDP, "train.global_batch_size=32"]  # 2 nodes x 2 ranks
NOLOCO = ["experiment=noloco_cpu", "train.steps=40"]
KILL = ["experiment=ddp_cpu", "train.steps=60", "train.checkpoint_every=10"]
SWEEP = ["-m", "hydra/launcher=slurm", "launcher=torchrun", *DDP, "optim.lr=1e-3,2e-3"]
DONE = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


class Site:
    """The cluster, the submit dir (the README's repo-root cwd; logs and runs/ go here) and the reference runs."""

    def __init__(self, cluster: LocalSlurm, submit_dir: Path):
        self.cluster, self.dir = cluster, submit_dir
        self.env = {
            **cluster.env,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
        }
        self.jobs: dict[str, int] = {}
        self.local: dict[str, subprocess.Popen] = {}
        self.started = time.monotonic()

    def sbatch(self, name: str, *args: str) -> int:
        out = subprocess.run(args, cwd=self.dir, env=self.env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        self.jobs[name] = int(re.search(r"Submitted batch job (\d+)", out.stdout).group(1))
        return self.jobs[name]

    def decentrain(self, name: str, *overrides: str, log: str | None = None) -> None:
        """Start `decentrain <overrides>` in the submit dir (a local reference run, or the Slurm sweep)."""
        with open(self.dir / f"{name}.log", "w") as f:
            self.local[name] = subprocess.Popen(
                recipe_command("recipes.train", *overrides),
                cwd=self.dir,
                env=self.env,
                stdout=f,
                stderr=subprocess.STDOUT,
            )

    def finish_local(self, name: str, timeout: float = 1500) -> Path:
        assert self.local[name].wait(timeout=timeout) == 0, (self.dir / f"{name}.log").read_text()[-3000:]
        return self.dir / "runs" / name

    def job(self, job_id: int) -> dict[str, str]:
        out = subprocess.run(
            ["scontrol", "-o", "show", "job", str(job_id)], env=self.env, capture_output=True, text=True
        )
        return dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)

    def wait(self, job_id: int, timeout: float = 1500) -> dict[str, str]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            info = self.job(job_id)
            assert info, f"job {job_id} is unknown to slurmctld"
            if info.get("JobState") in DONE:
                return info
            time.sleep(2)
        raise TimeoutError(f"job {job_id} not done after {timeout:.0f} s: {self.job(job_id)}")

    def log(self, job_id: int) -> str:
        return (self.dir / f"slurm-decentrain-{job_id}.out").read_text()


def scalars(run_dir: Path) -> list[dict]:
    """A run's metrics without timings: what must match bit for bit between two runs of one config."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith(("perf/", "time/"))} for r in rows]


def worlds(text: str) -> set[int]:
    return {int(w) for w in re.findall(r"\] \w+: [\d.]+M params, world (\d+)", text)}


def rank_logs(run_dir: Path) -> str:
    return "".join(p.read_text() for p in sorted((run_dir / "logs").glob("*.out")))


@pytest.fixture(scope="module")
def site(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("slurm")
    cluster = LocalSlurm(root / "cluster")
    cluster.start()
    submit = root / "repo"
    submit.mkdir()
    s = Site(cluster, submit)
    try:
        # Everything the selected tests need is queued at once; Slurm packs what fits (8 CPUs), the rest waits.
        wanted = {item.originalname for item in request.session.items}
        if "test_two_jobs_share_a_node" in wanted:  # first, so that both start at once on the idle node
            for i in (0, 1):  # two jobs pinned to one node: they must not meet in each other's rendezvous
                s.sbatch(
                    f"shared{i}",
                    "sbatch",
                    "--nodes",
                    "1",
                    f"--nodelist={cluster.nodes[1]}",
                    str(ROOT / "launch/slurm.sbatch"),
                    *DDP,
                )
        if "test_killed_rank_and_requeue_resume" in wanted:
            s.sbatch("kill", *SBATCH, *KILL)  # early, so it runs while its test watches it
            s.decentrain("ref_kill", *KILL, "run_dir=runs/ref_kill")
        if "test_config_error_fails_once" in wanted:
            s.sbatch("bad_config", *SBATCH, "experiment=ddp_cpu", "train.global_batch_size=10")
        if wanted & {"test_sbatch_matches_local", "test_two_jobs_share_a_node", "test_sweep_runs_a_world_per_point"}:
            s.decentrain("ref_ddp", *DDP, "run_dir=runs/ref_ddp")
        if "test_sbatch_matches_local" in wanted:
            s.sbatch("one_node", *SBATCH, *DDP)
            s.sbatch("two_nodes", "sbatch", "--nodes", "2", str(ROOT / "launch/slurm.sbatch"), *DDP4)
            s.sbatch("noloco", "sbatch", "--nodes", "2", str(ROOT / "launch/slurm.sbatch"), *NOLOCO)
            s.decentrain("ref_ddp4", *DDP4, "launcher.nproc_per_node=4", "run_dir=runs/ref_ddp4")
            s.decentrain("ref_noloco", *NOLOCO, "run_dir=runs/ref_noloco")
        if "test_sweep_runs_a_world_per_point" in wanted:
            s.decentrain("sweep", *SWEEP)
        yield s
    finally:
        for name, job in s.jobs.items():  # one line per job for the record: state, world, run time
            info = s.job(job)
            run = s.dir / f"runs/slurm-{job}"
            world = sorted(worlds(rank_logs(run))) if (run / "logs").exists() else []
            print(
                f"\n{name}: job {job} {info.get('JobState')} world {world} run {info.get('RunTime')} "
                f"restarts {info.get('Restarts')} nodes {info.get('NodeList')}",
                file=sys.stderr,
            )
        for p in s.local.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                p.wait(timeout=30)
        cluster.stop()
        print(f"\nlocal Slurm tier: {time.monotonic() - s.started:.0f} s", file=sys.stderr)


# First: this test acts on its job while it runs (the others only read finished jobs).
def worker_pid(run_dir: str, rank: int) -> int | None:
    """The pid of torchrun's worker `rank` of the job whose run dir is `run_dir` (found through /proc)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        # slurm.sbatch passes the run dir made absolute: match it by its tail
        ours = any(a.startswith(b"run_dir=") and a.endswith(f"/{run_dir}".encode()) for a in cmd)
        if ours and f"RANK={rank}".encode() in env and b"torchrun" not in cmd[1]:
            if any(e.startswith(b"TORCHELASTIC_RUN_ID=") for e in env):
                return int(proc.name)
    return None


def test_killed_rank_and_requeue_resume(site):
    """kill -9 of one rank: torchrun restarts the group from the last checkpoint; then `scontrol requeue`:
    attempt 1 (its own log) resumes from the last checkpoint again; the run ends equal to an uninterrupted one."""
    job = site.jobs["kill"]
    run = site.dir / f"runs/slurm-{job}"
    steps = lambda: [r["step"] for r in scalars(run) if "train/loss" in r] if (run / "metrics.jsonl").exists() else []  # noqa: E731

    def wait_for(ok, what: str, timeout: float = 1800) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end and not ok():
            assert site.job(job).get("JobState") not in DONE, f"job ended before {what}: {site.log(job)}"
            time.sleep(1)
        assert ok(), f"no {what} after {timeout:.0f} s"

    wait_for(lambda: max(steps(), default=0) >= 20 and worker_pid(f"runs/slurm-{job}", 1), "step 20")
    os.kill(worker_pid(f"runs/slurm-{job}", 1), signal.SIGKILL)
    wait_for(lambda: max(steps(), default=0) >= 40, "step 40 after the kill")
    subprocess.run(["scontrol", "requeue", str(job)], env=site.env, check=True)
    info = site.wait(job)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", info
    assert "attempt 1" in site.log(job) and (run / "logs/attempt1-node0.out").exists()
    logs = rank_logs(run)
    assert len(re.findall(r"resumed from step \d+", logs)) >= 2, logs[-4000:]  # after the kill, after the requeue
    assert scalars(run) == scalars(site.finish_local("ref_kill"))


def test_config_error_fails_once(site):
    info = site.wait(site.jobs["bad_config"])
    assert info["JobState"] == "FAILED"
    log = site.log(site.jobs["bad_config"])
    assert log.count("config error: train.global_batch_size=10") == 1, log
    assert not list((site.dir / f"runs/slurm-{site.jobs['bad_config']}/logs").glob("*.out")), "torchrun started anyway"


@pytest.mark.parametrize(
    "name,ref,world", [("one_node", "ref_ddp", 2), ("two_nodes", "ref_ddp4", 4), ("noloco", "ref_noloco", 4)]
)
def test_sbatch_matches_local(site, name, ref, world):
    job = site.jobs[name]
    info = site.wait(job)
    run = site.dir / f"runs/slurm-{job}"
    assert info["JobState"] == "COMPLETED", site.log(job) + rank_logs(run)[-3000:]
    assert worlds(rank_logs(run)) == {world}
    assert scalars(run) == scalars(site.finish_local(ref))


def test_two_jobs_share_a_node(site):
    infos = [site.wait(site.jobs[f"shared{i}"]) for i in (0, 1)]
    assert [i["JobState"] for i in infos] == ["COMPLETED", "COMPLETED"], [
        site.log(site.jobs[f"shared{i}"]) for i in (0, 1)
    ]
    assert {i["NodeList"] for i in infos} == {site.cluster.nodes[1]}
    (s0, e0), (s1, e1) = [(i["StartTime"], i["EndTime"]) for i in infos]
    assert s1 < e0 and s0 < e1, f"the two jobs did not overlap: {infos}"
    ref = scalars(site.finish_local("ref_ddp"))
    for i in (0, 1):
        assert scalars(site.dir / f"runs/slurm-{site.jobs[f'shared{i}']}") == ref


def test_sweep_runs_a_world_per_point(site):
    assert site.local["sweep"].wait(timeout=1500) == 0, (site.dir / "sweep.log").read_text()[-3000:]
    points = sorted(p for p in (site.dir / "runs/multirun").glob("*/*/[0-9]*") if p.is_dir())
    assert len(points) == 2
    task_logs = "".join(p.read_text() for p in (site.dir / "runs/multirun").glob("*/*/.submitit/*/*_log.*"))
    assert len(re.findall(r"world 2", task_logs)) == 2, task_logs[-3000:]
    for p in points:
        rows = scalars(p)
        assert len({r["step"] for r in rows if "train/loss" in r}) == len([r for r in rows if "train/loss" in r]), (
            "duplicate ranks"
        )
    lr2 = next(p for p in points if yaml.safe_load((p / "config.yaml").read_text())["optim"]["lr"] == 2e-3)
    assert scalars(lr2) == scalars(site.finish_local("ref_ddp"))  # lr=2e-3 is the default: the local DDP run


def test_unschedulable_sweep_fails_fast(site):
    t = time.monotonic()
    out = subprocess.run(
        recipe_command(
            "recipes.train",
            "-m",
            "hydra/launcher=slurm",
            "launcher=torchrun",
            "hydra.launcher.cpus_per_task=64",
            "optim.lr=1e-3",
        ),
        cwd=site.dir,
        env=site.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0 and "Slurm cannot schedule" in out.stderr, out.stderr[-2000:]
    assert time.monotonic() - t < 240  # no wait for a job: only start-up (slow on a loaded 2-core box)
