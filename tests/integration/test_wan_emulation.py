"""launch/wan_emulation.sh end to end: namespaces up, traffic flows only inside them, all torn down.

Opt-in: needs root, `ip`, `tc` and DECENTRAIN_NETNS_TESTS=1 (it changes the host's
network namespaces, so CI does not run it by default). The delay test also needs
`iptables` and `NetfilterQueue` importable by this Python.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "launch" / "wan_emulation.sh"
PREFIX = "dtt"  # not the default "dt", so a user's own setup is left alone
ENV = {**os.environ, "WAN_PREFIX": PREFIX, "PYTHON": sys.executable}

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not (
            hasattr(os, "geteuid")
            and os.geteuid() == 0
            and shutil.which("ip")
            and shutil.which("tc")
            and os.environ.get("DECENTRAIN_NETNS_TESTS") == "1"
        ),
        reason="needs root, ip, tc and DECENTRAIN_NETNS_TESTS=1",
    ),
]

# Receiver: read NBYTES from one TCP connection, answer one byte. Sender: time send -> answer.
RECV = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.77.0.2", 5001)); s.listen(1); print("listening", flush=True)
c, _ = s.accept(); n = int(sys.argv[1]); got = 0
while got < n:
    b = c.recv(1 << 20)
    if not b: break
    got += len(b)
c.sendall(b"k")
"""
SEND = """
import socket, sys, time
n = int(sys.argv[1]); t0 = time.perf_counter()
c = socket.create_connection(("10.77.0.2", 5001), timeout=20); c.sendall(b"x" * n); c.recv(1)
print(time.perf_counter() - t0)
"""


def wan(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], env=ENV, check=check, capture_output=True, text=True, timeout=60)


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


@pytest.fixture
def emulation() -> Iterator[None]:
    wan("down", check=False)  # leftovers of an interrupted run
    yield
    wan("down")
    assert not {f"{PREFIX}0", f"{PREFIX}1", f"{PREFIX}br"} & namespaces()


def tcp_transfer(nbytes: int) -> float:
    recv = subprocess.Popen(
        [str(SCRIPT), "exec", "1", sys.executable, "-c", RECV, str(nbytes)], env=ENV, stdout=subprocess.PIPE, text=True
    )
    try:
        assert recv.stdout is not None and recv.stdout.readline().strip() == "listening"
        out = wan("exec", "0", sys.executable, "-c", SEND, str(nbytes)).stdout
        return float(out.strip())
    finally:
        recv.wait(timeout=20)


def test_two_namespaces_rate_capped_and_isolated(emulation: None) -> None:
    wan("up", "2", "100mbit")
    assert {f"{PREFIX}0", f"{PREFIX}1", f"{PREFIX}br"} <= namespaces()
    assert "tbf" in wan("status").stdout

    # 2.5 MB at 100 Mbit/s: floor 0.2 s; TCP/IP headers add ~5%.
    seconds = tcp_transfer(2_500_000)
    assert 0.19 < seconds < 0.5, seconds

    # No route out of the test subnet: nothing can leak to real networks.
    leak = wan("exec", "0", "ip", "route", "get", "192.0.2.1", check=False)
    assert leak.returncode != 0 and "unreachable" in leak.stderr.lower()


@pytest.mark.skipif(
    not (shutil.which("iptables") and importlib.util.find_spec("netfilterqueue")),
    reason="needs iptables and NetfilterQueue",
)
def test_delay_line_adds_rtt(emulation: None) -> None:
    wan("up", "2", "100mbit", "50")
    # ping -U: user-to-user time; plain ping stamps replies before the delay line sees them.
    out = wan("exec", "0", "ping", "-U", "-c", "3", "-i", "0.2", "10.77.0.2").stdout
    avg_ms = float(out.strip().splitlines()[-1].split("=")[1].split("/")[1])
    assert 95 < avg_ms < 130, out
    # `down` must also stop the delay-line processes.
    pids = [int(p.read_text()) for p in Path(f"/run/decentrain-wan-{PREFIX}").glob("delay*.pid")]
    assert len(pids) == 2
    wan("down")
    deadline = time.monotonic() + 2  # exited ones may linger as zombies until init reaps them
    while any(is_delay_line(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(is_delay_line(pid) for pid in pids)


def is_delay_line(pid: int) -> bool:
    try:
        return b"delay_line.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
