"""Emulated hosts for a gossip job over several machines: one network namespace per host.

Used by benchmarks/fault_tolerance_hosts.py and tests/integration/test_noloco_hosts.py. Namespaces
come from launch/wan_emulation.sh (veth pairs on a bridge, tbf-capped uplinks, optional delay
line) under a prefix unique to this run, and are always removed on exit. The last namespace runs
the job store (`python -m decentrain.core.comm.job_store`) and nothing else; each other one is a host:
`recipes.train launcher=hosts` with its node rank, as launch/multinode.sh starts it on a machine.

The root namespace cannot reach the emulated subnet, so reading the store is done by a short-lived
client run inside the store's namespace (`wait_progress`, `wait_heal_request`): the caller
synchronises on store keys, never on time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WAN = ROOT / "launch" / "wan_emulation.sh"
SUBNET = "10.77.0"  # launch/wan_emulation.sh: namespace i is SUBNET.(i+1)
STORE_PORT = 29400
# where workers keep their gossip keys in the job store: World.store's prefix, then the first job's namespace
JOB_KEYS = "decentrain/attempt0/shared/job1/"
LAUNCHER_KEYS = "decentrain/attempt0/shared/launcher/incarnation/"  # the launchers' incarnation records

# Run inside the store's namespace: block until the condition holds, print what was seen.
WAITER = """
import sys, time
from datetime import timedelta
from torch.distributed import TCPStore
host, port, mode, *args = sys.argv[1:]
s = TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=60))
prefix = {prefix!r}
launcher = {launcher!r}
def done(rank):
    key = f"{{prefix}}progress/{{rank}}"
    return int(s.get(key).split(b",")[1]) if s.check([key]) else -1
while True:
    if mode == "progress" and any(done(int(r)) >= int(args[0]) for r in args[1:]):
        break
    if mode == "heal":  # heal/<donor>/<rank>/<incarnation>, of an incarnation a launcher started (its record)
        started = [(r, i) for r in range(16) for i in (1, 2, 3) if s.check([f"{{launcher}}{{r}}/{{i}}"])]
        if any(s.check([f"{{prefix}}heal/{{d}}/{{r}}/{{i}}"]) for d in args for r, i in started):
            break
    time.sleep(0.1)
print("seen", flush=True)
"""


def netns_available() -> str | None:
    """Why emulated hosts cannot run here (None: they can)."""
    if not (hasattr(os, "geteuid") and os.geteuid() == 0):
        return "needs root (network namespaces)"
    for tool in ("ip", "tc"):
        if subprocess.run(["which", tool], capture_output=True).returncode:
            return f"needs `{tool}`"
    return None


class EmulatedHosts:
    """`hosts` worker hosts plus `spares` idle ones (started later in a dead host's place), and the store's
    namespace."""

    def __init__(
        self,
        hosts: int,
        spares: int = 0,
        rate: str = "1gbit",
        delay_ms: float = 0,
        delay_python: str = sys.executable,
        env: dict[str, str] | None = None,
    ):
        self.prefix = f"dh{uuid.uuid4().hex[:6]}"  # unique per run: parallel runs and a user's own setup stay apart
        self.n = hosts + spares + 1
        self.store_ns = self.n - 1
        self.rate, self.delay_ms = rate, delay_ms
        # gloo finds its address through the hostname, which in a namespace is 127.0.0.1: name the interface
        self.env = {
            **os.environ,
            "WAN_PREFIX": self.prefix,
            "PYTHON": delay_python,
            "GLOO_SOCKET_IFNAME": "eth0",
            **(env or {}),
        }
        self.store_addr = f"{SUBNET}.{self.n}:{STORE_PORT}"
        self.procs: list[subprocess.Popen] = []

    # -- namespaces ---------------------------------------------------------------------
    def wan(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run([str(WAN), *args], env=self.env, check=check, capture_output=True, text=True, timeout=120)

    def namespaces(self) -> set[str]:
        out = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True).stdout
        return {line.split()[0] for line in out.splitlines() if line.strip().startswith(self.prefix)}

    def __enter__(self) -> "EmulatedHosts":
        try:
            self.wan("up", str(self.n), self.rate, str(self.delay_ms))
            ready = Path(f"/run/decentrain-wan-{self.prefix}/store.addr")
            self.store = self.spawn(
                self.store_ns,
                [
                    sys.executable,
                    "-m",
                    "decentrain.core.comm.job_store",
                    "--host",
                    f"{SUBNET}.{self.n}",
                    "--port",
                    str(STORE_PORT),
                    "--ready-file",
                    str(ready),
                ],
                subprocess.DEVNULL,
            )
            while not ready.exists():
                if self.store.poll() is not None:
                    raise RuntimeError(f"the job store exited with {self.store.returncode}")
                time.sleep(0.1)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        for i in range(self.n):
            self.kill_host(i)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        self.wan("down", check=False)

    # -- processes ----------------------------------------------------------------------
    def spawn(self, i: int, cmd: list[str], out: Any, env: dict[str, str] | None = None) -> subprocess.Popen:
        p = subprocess.Popen(
            ["ip", "netns", "exec", f"{self.prefix}{i}", *cmd],
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.procs.append(p)
        return p

    def start_host(
        self, i: int, node_rank: int, nnodes: int, nproc: int, overrides: list[str], log: Path, job_id: str = "job"
    ) -> subprocess.Popen:
        """Host `i` runs node `node_rank`'s launcher and workers (launch/multinode.sh's command)."""
        args = [
            sys.executable,
            "-u",
            "-m",
            "recipes.train",
            *overrides,
            "launcher=hosts",
            f"launcher.nnodes={nnodes}",
            f"launcher.nproc_per_node={nproc}",
            f"launcher.node_rank={node_rank}",
            f"launcher.store={self.store_addr}",
            f"launcher.job_id={job_id}",
        ]
        return self.spawn(i, args, open(log, "w"))

    def pids(self, i: int) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", f"{self.prefix}{i}"], capture_output=True, text=True).stdout
        return [int(p) for p in out.split()]

    def signal_host(self, i: int, sig: int) -> int:
        """Send `sig` to every process of host `i`; how many got it."""
        sent = 0
        for pid in self.pids(i):
            try:
                os.kill(pid, sig)
                sent += 1
            except ProcessLookupError:
                pass
        return sent

    def kill_host(self, i: int) -> None:
        """SIGKILL every process of host `i` (again, until none is left: a launcher may start one meanwhile)."""
        for _ in range(50):
            if not self.signal_host(i, signal.SIGKILL):
                return
            time.sleep(0.05)

    # -- store reads (inside the store's namespace) ----------------------------------------
    def _wait(self, *args: str, launchers: list[subprocess.Popen], timeout_s: float) -> None:
        """Run the waiter; RuntimeError if it fails, times out, or every launcher in `launchers` has exited."""
        code = WAITER.format(prefix=JOB_KEYS, launcher=LAUNCHER_KEYS)
        host, port = self.store_addr.split(":")
        p = self.spawn(self.store_ns, [sys.executable, "-c", code, host, port, *args], subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        while p.poll() is None:
            if time.monotonic() > deadline or any([q.poll() is not None for q in launchers]):
                p.kill()
                raise RuntimeError(
                    f"store wait {args}: a launcher exited ({[q.returncode for q in launchers]}) "
                    f"or {timeout_s:.0f}s passed first"
                )
            time.sleep(0.2)
        out = p.stdout.read() if p.stdout else ""
        if p.returncode != 0 or "seen" not in out:
            raise RuntimeError(f"store wait {args} failed ({p.returncode}): {out[-2000:]}")

    def wait_progress(
        self, ranks: list[int], rounds: int, launchers: list[subprocess.Popen], timeout_s: float = 600
    ) -> None:
        """Until one of `ranks` has published `rounds` outer rounds done (a round key in the store)."""
        self._wait("progress", str(rounds), *map(str, ranks), launchers=launchers, timeout_s=timeout_s)

    def wait_heal_request(self, donors: list[int], launchers: list[subprocess.Popen], timeout_s: float = 600) -> None:
        """Until a replacement has asked one of `donors` for its state."""
        self._wait("heal", *map(str, donors), launchers=launchers, timeout_s=timeout_s)
