"""Run a function on N gloo ranks (OLMo-core style): fresh processes, a free port, torchrun's env.
Also: run a function alone in a fresh process, or on N threads of this one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Callable

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(
    rank: int, world_size: int, port: int, fn: Callable, args: tuple, results, backend: str, store: str | None = None
) -> None:
    host = "127.0.0.1"
    if store is not None:  # every rank a client of a job store, as under the hosts launcher
        host, _, port_s = store.rpartition(":")
        port = int(port_s)
        os.environ["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    os.environ.update(
        MASTER_ADDR=host,
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        OMP_NUM_THREADS="1",
    )
    import torch.distributed as dist

    from decentrain.core.world import init_world

    world = init_world(backend=backend, timeout_s=120, threads=1)
    try:
        results.put((rank, "ok", fn(world, *args)))
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class _PortTaken(Exception):
    pass


def run_ranks(
    fn: Callable,
    world_size: int,
    *args: Any,
    timeout: float = 300.0,
    backend: str = "gloo",
    expect_dead: tuple[int, ...] = (),
    attempts: int = 3,
    store: str | None = None,
) -> list[Any]:
    """`fn(world, *args)` on every rank; returns the results in rank order, re-raising any rank's error.

    `timeout` bounds the wait for each rank's result: a hang detector, generous because a loaded box
    (2 cores, other work beside it) stretches a rank's start-up and rendezvous to minutes.
    Ranks in `expect_dead` are meant to kill themselves: they return no result (None in the list).
    The free port is free when picked, not when rank 0 binds it: under pytest-xdist another worker
    may take it in between, so a launch whose store could not bind is retried on a new port.
    `store`: HOST:PORT of a job store (`start_store`) that every rank joins as a client, instead of
    rank 0 hosting the store.
    """
    for attempt in range(attempts):
        try:
            return _launch(fn, world_size, args, timeout, backend, expect_dead, store)
        except _PortTaken:
            if attempt == attempts - 1:
                raise AssertionError(f"no free port for the store after {attempts} attempts") from None
    raise AssertionError("unreachable")


def _launch(
    fn: Callable,
    world_size: int,
    args: tuple,
    timeout: float,
    backend: str,
    expect_dead: tuple[int, ...],
    store: str | None = None,
) -> list[Any]:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_entry, args=(r, world_size, port, fn, args, results, backend, store))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    try:
        for _ in range(world_size - len(expect_dead)):
            rank, status, value = results.get(timeout=timeout)
            if status == "error":
                if "EADDRINUSE" in value or "address already in use" in value.lower():
                    raise _PortTaken()
                raise AssertionError(f"rank {rank} failed:\n{value}")
            out[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [out.get(r) for r in range(world_size)]


def _alone(fn: Callable, args: tuple, results) -> None:
    try:
        results.put(("ok", fn(*args)))
    except BaseException:
        results.put(("error", traceback.format_exc()))


def run_in_fresh_process(fn: Callable, *args: Any, timeout: float = 300.0) -> Any:
    """`fn(*args)` in a spawned interpreter; returns its result, re-raising its error.

    For code that forks helpers (hivemind's DHT is a fork of its caller): a fork of the test
    process inherits hundreds of tests' threads and locks, a node's own process does not.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    proc = ctx.Process(target=_alone, args=(fn, args, results))
    proc.start()
    try:
        status, value = results.get(timeout=timeout)
    finally:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    if status == "error":
        raise AssertionError(f"in the fresh process:\n{value}")
    return value


def run_in_threads(fn: Callable[[int], Any], n: int, timeout: float = 60.0) -> list[Any]:
    """`fn(rank)` for rank 0..n-1 on threads of this process (in-process replicas, fakes of a
    backend); the results in rank order. A rank that raised or is still running after `timeout`
    (a deadlock) fails the test."""
    out, errors = {}, {}

    def main(rank: int) -> None:
        try:
            out[rank] = fn(rank)
        except BaseException as e:  # noqa: BLE001 -- reported below
            errors[rank] = e

    threads = [threading.Thread(target=main, args=(r,), daemon=True) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    stuck = [r for r, t in enumerate(threads) if t.is_alive()]
    assert not errors and not stuck, f"ranks that raised: {errors}; ranks still running after {timeout} s: {stuck}"
    return [out[r] for r in range(n)]


def start_store(tmp_path: Path) -> tuple[subprocess.Popen, str]:
    """Start the store; returns (process, HOST:PORT) once it accepts clients (its ready file)."""
    ready = tmp_path / "store.addr"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "decentrain.core.comm.job_store",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--ready-file",
            str(ready),
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    while not ready.exists():
        assert proc.poll() is None, proc.stderr.read()
        threading.Event().wait(0.05)
    return proc, ready.read_text().strip()
