"""Independent SAPO nodes over a hivemind DHT on loopback: one dies, the others keep going."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from decentrain.testing import run_in_fresh_process

pytest.importorskip("hivemind")
pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "model.hidden_size=32",
    "model.num_layers=2",
    "model.intermediate_size=64",
    "model.num_heads=4",
    "sampling.max_new_tokens=4",
    "loss.num_generations=4",
    "train.micro_batch_size=16",
    "train.threads=1",
    "task.size=100",
    "logger.progress=false",
    "logger.console=false",
    "batch.num_local=2",
    "batch.num_external=2",
    "train.rounds=10000",
    "train.checkpoint_every=0",
    "exchange.hivemind.wait_s=0.5",
]


def _rounds(run_dir: Path, node: str) -> int:
    path = run_dir / node / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _received(run_dir: Path, node: str) -> int:
    path = run_dir / node / "metrics.jsonl"
    return sum(json.loads(line)["external_received"] for line in path.read_text().splitlines())


def _wait(cond, timeout: float, procs) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        for p in procs:
            assert p.poll() is None, p.stderr.read().decode()[-3000:] if p.stderr else "node exited"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.25)


def test_three_nodes_one_killed_the_rest_keep_training(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    peers = tmp_path / "peers.txt"

    def start(i):
        args = [
            *TINY,
            "sapo=hivemind",
            f"node_index={i}",
            f"exchange.hivemind.peers_file={peers}",
            f"run_dir={tmp_path}",
        ]
        # Own session per node: killing its process group takes its DHT process and p2p daemon too.
        return subprocess.Popen(
            [sys.executable, "-m", "recipes.rl", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    procs = [start(0)]
    try:
        _wait(lambda: peers.exists() and peers.read_text().strip(), 60, procs)  # node 0 started the swarm
        procs += [start(1), start(2)]
        nodes = ["node0", "node1", "node2"]
        _wait(lambda: all(_rounds(tmp_path, n) >= 2 for n in nodes), 60, procs)
        os.killpg(procs[2].pid, signal.SIGKILL)  # the node's machine dies: no goodbye to the swarm
        procs[2].wait()
        after = {n: _rounds(tmp_path, n) for n in nodes[:2]}
        _wait(lambda: all(_rounds(tmp_path, n) >= after[n] + 3 for n in nodes[:2]), 45, procs[:2])
        assert all(_received(tmp_path, n) > 0 for n in nodes[:2])  # they did see peers' rollouts
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)  # anything the node left behind (its session only)
            except ProcessLookupError:
                pass


def test_exchange_returns_new_peer_records_once_and_refuses_junk_at_the_dht():
    # A fresh process forks the DHTs, as a node's own process would (see run_in_fresh_process).
    run_in_fresh_process(_records_once_and_junk_refused)


def _records_once_and_junk_refused() -> None:
    from hivemind.utils import get_dht_time

    from decentrain.algorithms.sapo.exchange import ExchangeConfig, HivemindConfig, build_exchange
    from decentrain.core.world import World

    cfg = ExchangeConfig(name="hivemind", hivemind=HivemindConfig(wait_s=5.0, prefix="t"))
    a = build_exchange(cfg, World(), "a")
    b_cfg = ExchangeConfig(name="hivemind", hivemind=HivemindConfig(wait_s=0.0, prefix="t", initial_peers=a.maddrs))
    b = build_exchange(b_cfg, World(), "b")
    try:
        big = bytes(range(256)) * 400  # ~100 KB: several chunks, each below hivemind's 16 KiB pipe limit
        b.exchange(0, big)
        got = a.exchange(0, b"from-a")
        assert [(r.data, r.round) for r in got] == [(big, 0)]
        a.hcfg.wait_s = 0.0
        assert a.exchange(1, b"again") == []  # (round 0, b) is not returned twice
        # A value of the wrong shape, anywhere in the namespace: every honest node refuses to store it.
        assert not b.dht.store(b.registry, {"round": "zero"}, expiration_time=get_dht_time() + 30, subkey="evil")
        assert not b.dht.store(b.own_key, b"plain", expiration_time=get_dht_time() + 30)
        b.exchange(1, b"from-b1")
        a.hcfg.wait_s = 5.0
        assert [(r.data, r.round) for r in a.exchange(2, b"y")] == [(b"from-b1", 1)]
        assert a.drops.total() == 0
    finally:
        a.close()
        b.close()


def test_inflate_caps_output_before_expanding():
    from decentrain.algorithms.sapo.dht_guard import compress, inflate

    bomb = compress(b"\0" * (64 << 20))  # 64 MiB of zeros in ~64 KB
    assert len(bomb) < 100_000 and inflate(bomb, 1 << 20) is None
    assert inflate(compress(b"ok"), 2) == b"ok" and inflate(compress(b"ok") + b"x", 2) is None
    assert inflate(b"not zlib", 100) is None
