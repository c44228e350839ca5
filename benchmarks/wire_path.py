"""wire_path: the pair exchange's CPU cost on loopback, against a gloo ring all-reduce of the same bytes.

On loopback the link is nearly free, so what a sync costs beyond a ring all-reduce is the
wire format's CPU work: staging copies, receive buffers, the checksum and the finite
check. N=2 ranks (processes), one payload of `--numel` fp32 values (100 MB by default):

  ring         dist.all_reduce of the payload, in place (DiLoCo's sync; 2(N−1)/N·S = S bytes
               up per rank at N=2, the same as the pair swap)
  pair         PairExchange.exchange with one process group per direction and pooled wire
               buffers (core/comm/buffer_pool.py): what NoLoCo runs
  pair_fresh   the same with a fresh send copy and fresh receive buffers every round (the
               wire path before the pool)
Each method runs `--repeats` untimed rounds first (connections up, buffers warm), then
`--repeats` timed ones; a round's time is the slower rank's. Beside them, the single-rank
cost of each CPU pass over the payload (median of 5): checksum, finite check, a copy into a
warm buffer and into a fresh one.

    OMP_NUM_THREADS=1 nice -n 10 python -m benchmarks.wire_path            # 100 MB, 2 ranks
    python -m benchmarks.wire_path --numel 1000000 --repeats 3             # smoke
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from typing import Any

from benchmarks.harness import Harness, bench_parser, parse, save_figure

METHODS = ("ring", "pair", "pair_fresh")


def _passes(numel: int) -> dict[str, float]:
    """Median seconds of each CPU pass the wire format makes over one payload."""
    import torch

    from decentrain.core.comm.wire import all_finite, checksum

    x = torch.randn(numel, generator=torch.Generator().manual_seed(0))
    warm = torch.zeros_like(x)

    def med(fn) -> float:
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    return {
        "checksum": med(lambda: checksum([x])),
        "finite_check": med(lambda: all_finite(x)),
        "copy_into_warm_buffer": med(lambda: warm.copy_(x)),
        "copy_into_fresh_buffer": med(lambda: x.clone()),
    }


def _rank(rank: int, port: int, numel: int, repeats: int, queue) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE="2",
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE="2",
        OMP_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME="lo",
    )
    import torch
    import torch.distributed as dist

    from decentrain.core.comm.pair_exchange import PairExchange
    from decentrain.core.world import init_world

    world = init_world(backend="gloo", timeout_s=600, threads=1)
    payload = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
    pooled = PairExchange(world, reuse_buffers=True).full_duplex()
    fresh = PairExchange(world, reuse_buffers=False).full_duplex()
    methods = {
        "ring": lambda r: dist.all_reduce(payload),
        "pair": lambda r: pooled.exchange([payload], (0, 1), r) is not None or _fail(),
        "pair_fresh": lambda r: fresh.exchange([payload], (0, 1), r) is not None or _fail(),
    }
    out: dict[str, list[float]] = {}
    for name, fn in methods.items():
        for r in range(repeats):
            fn(r)
        times = []
        for r in range(repeats, 2 * repeats):
            dist.barrier()
            t0 = time.perf_counter()
            fn(r)
            mine = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX)
            times.append(float(mine))
        out[name] = times
    if rank == 0:
        queue.put(out)
    world.shutdown()


def _fail() -> bool:
    raise RuntimeError("a clean loopback exchange failed")


def measure(numel: int, repeats: int) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, port, numel, repeats, queue)) for r in range(2)]
    for p in procs:
        p.start()
    times = queue.get(timeout=1800)
    for p in procs:
        p.join(timeout=120)
        if p.exitcode != 0:
            raise RuntimeError(f"a rank exited with {p.exitcode}")
    med = {m: statistics.median(t) for m, t in times.items()}
    return {
        "times_s": times,
        "median_s": med,
        "pair_vs_ring": med["pair"] / med["ring"],
        "pair_fresh_vs_ring": med["pair_fresh"] / med["ring"],
        "passes_s": _passes(numel),
        "loadavg": list(os.getloadavg()),
    }


def text(record: dict[str, Any]) -> str:
    c, f, env = record["config"], record["figures"], record["hardware"]
    lines = [
        f"wire_path @ {record['git_sha'][:12]}: {env['cpu']}, {env['cpu_count']} cores, 1-min load avg at end "
        f"{f['loadavg'][0]:.1f} (shared box: loopback times are CPU-bound)",
        f"N=2 on loopback, payload {c['numel'] * 4 / 1e6:.1f} MB fp32, {c['repeats']} warm-up + {c['repeats']} "
        "timed rounds",
        "",
        f"{'method':11s} {'median s':>9s} {'x ring':>7s}   all timed rounds",
    ]
    for m in METHODS:
        lines.append(
            f"{m:11s} {f['median_s'][m]:9.3f} {f['median_s'][m] / f['median_s']['ring']:7.2f}   "
            + ", ".join(f"{t:.3f}" for t in f["times_s"][m])
        )
    lines += [
        "",
        f"pair / ring = {f['pair_vs_ring']:.2f} (target <= 1.5: {'met' if f['pair_vs_ring'] <= 1.5 else 'not met'}); "
        f"before the buffer pool {f['pair_fresh_vs_ring']:.2f}",
        "",
        "one CPU pass over the payload, single rank (median of 5):",
    ]
    for k, v in f["passes_s"].items():
        lines.append(f"  {k:24s} {v * 1e3:8.1f} ms")
    return "\n".join(lines)


def plot(record: dict[str, Any], png) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    f = record["figures"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.bar(list(METHODS), [f["median_s"][m] for m in METHODS], color=["gray", "tab:blue", "tab:orange"])
    ax.axhline(1.5 * f["median_s"]["ring"], ls="--", c="k", lw=1, label="1.5x ring")
    ax.set_ylabel("seconds per sync (median)")
    ax.set_title(f"N=2 loopback, {record['config']['numel'] * 4 / 1e6:.0f} MB")
    ax.legend()
    fig.tight_layout()
    save_figure(fig, png, dpi=120)


def main(argv: list[str] | None = None) -> None:
    ap = bench_parser(__doc__.splitlines()[0], seeds=None, smoke={"numel": 1_000_000, "repeats": 3})
    ap.add_argument("--numel", type=int, default=25_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--name", default="wire_path")
    args = parse(ap, argv)
    config = {"numel": args.numel, "repeats": args.repeats, "ranks": 2, "link": "loopback"}
    hz = Harness(args.name, __file__, config, allow_dirty=args.allow_dirty, fresh=args.fresh, smoke=args.smoke)
    figures = measure(args.numel, args.repeats)
    print(hz.write(figures, text, plot)["txt"].read_text())


if __name__ == "__main__":
    main()
