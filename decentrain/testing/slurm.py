"""A throwaway Slurm cluster on this host: munged, slurmctld and two slurmd (one per NodeName).

Everything (slurm.conf, state, spool, logs, munge socket) lives under one temp dir; the
daemons are started in the foreground (-D) as our children and stopped by PID. Clients
find the cluster through SLURM_CONF, which `LocalSlurm.env` sets.
Needs root and Debian's slurm-wlm + munge (22.05: select/cons_tres, no accounting).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from decentrain.testing.processes import free_port

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo")


def missing_requirements() -> str | None:
    """Why this host cannot run a local cluster, or None."""
    if os.geteuid() != 0:
        return "needs root (slurmd runs jobs as their user)"
    missing = [d for d in DAEMONS if shutil.which(d) is None and not Path(f"/usr/sbin/{d}").exists()]
    if missing:
        return f"missing {missing}: apt-get install -y slurm-wlm munge"
    if not Path("/etc/munge/munge.key").exists():
        return "no /etc/munge/munge.key (apt-get install -y munge creates it)"
    if len(loopback_names()) < 2:
        return "needs two host names that resolve to this host (e.g. in /etc/hosts) for the two NodeNames"
    return None


def loopback_names() -> list[str]:
    """Host names that resolve to a loopback address: each becomes one NodeName (jobs resolve it)."""
    names = [socket.gethostname().split(".")[0], "localhost"]
    hosts = Path("/etc/hosts")
    if hosts.exists():
        for line in hosts.read_text().splitlines():
            parts = line.split("#")[0].split()
            if parts and parts[0].startswith("127."):
                names += parts[1:]
    out = []
    for n in dict.fromkeys(names):
        try:
            if socket.gethostbyname(n).startswith("127."):
                out.append(n)
        except OSError:
            pass
    return out


def sbin(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


@dataclass
class LocalSlurm:
    root: Path
    cpus: int = 4  # per node, declared (SlurmdParameters=config_overrides): two 2-CPU jobs share one
    mem_mb: int = 16000
    nodes: list[str] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)
    spool: Path | None = None

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.root / "slurm.conf")}

    def write_conf(self) -> None:
        r = self.root
        for d in ("state", "log"):
            (r / d).mkdir(parents=True, exist_ok=True)
        # slurmstepd binds Unix sockets under the spool dir, and a socket path has 108 bytes at most: a pytest
        # tmp_path is too deep for it ("Unix socket path ... is too long"), so the spool lives in a short /tmp dir.
        self.spool = Path(tempfile.mkdtemp(prefix="dslurm", dir="/tmp"))
        host = socket.gethostname().split(".")[0]
        self.nodes = loopback_names()[:2]
        node_lines = "\n".join(
            f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={free_port()} CPUs={self.cpus} "
            f"RealMemory={self.mem_mb} State=UNKNOWN"
            for n in self.nodes
        )
        (r / "slurm.conf").write_text(f"""\
ClusterName=decentrain
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={r}/munge.sock
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={self.spool}/%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerParameters=sched_interval=2
MinJobAge=43200
KillWait=5
{node_lines}
PartitionName=debug Nodes={",".join(self.nodes)} Default=YES MaxTime=INFINITE State=UP
""")

    def start(self, timeout_s: float = 60.0) -> None:
        self.write_conf()
        r = self.root
        log = open(r / "log" / "daemons.out", "ab")
        self.procs.append(
            subprocess.Popen(
                [
                    sbin("munged"),
                    "-F",
                    "--force",
                    f"--socket={r}/munge.sock",
                    "--key-file=/etc/munge/munge.key",
                    f"--pid-file={r}/munged.pid",
                    f"--log-file={r}/log/munged.log",
                    f"--seed-file={r}/munge.seed",
                ],
                stdout=log,
                stderr=log,
            )
        )
        self._wait(lambda: (r / "munge.sock").exists(), timeout_s, "munged socket")
        self.procs.append(subprocess.Popen([sbin("slurmctld"), "-D", "-i"], env=self.env, stdout=log, stderr=log))
        for n in self.nodes:
            self.procs.append(subprocess.Popen([sbin("slurmd"), "-D", "-N", n], env=self.env, stdout=log, stderr=log))
        self._wait(self._nodes_idle, timeout_s, "both nodes idle")

    def _nodes_idle(self) -> bool:
        for p in self.procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args[0]} exited with {p.returncode}; see {self.root}/log")
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env, capture_output=True, text=True)
        states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
        return len(states) == len(self.nodes) and all(s == "idle" for s in states.values())

    @staticmethod
    def _wait(ok, timeout_s: float, what: str) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if ok():
                return
            time.sleep(0.5)
        raise TimeoutError(f"local Slurm: no {what} after {timeout_s:.0f} s")

    def stop(self) -> None:
        """scancel what is left, then stop the daemons we started, by PID, newest first."""
        subprocess.run(["scancel", "--user", "root"], env=self.env, capture_output=True)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs.clear()
        if self.spool is not None:
            shutil.rmtree(self.spool, ignore_errors=True)
