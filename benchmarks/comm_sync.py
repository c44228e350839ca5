"""comm_sync: time to sync a model-sized payload with N workers, against the link floor.

Methods (each timed as the slowest rank's wall time of one sync):
  pair        NoLoCo: average with one gossip partner (PairExchange, one process group
              per direction, so both directions stream at once);
  pair_1pg    the same swap on one shared process group (the naive baseline; N=2 only);
  ring        DiLoCo: gloo all-reduce of the whole payload;
  fragment    Streaming DiLoCo: all-reduce of one fragment, numel // P of the payload (the
              paper overlaps it with compute). Its rows record the bytes actually reduced.
              A real model's fragments differ in size (embeddings and head ride with two of
              them): `--fragment-model llama_125m` sizes the fragment as that model's largest.
Every method is timed warm: one untimed pass over the same rounds first (connections up).
Links: `loopback` (127.0.0.1) and `emulated` (one netns per worker via
launch/wan_emulation.sh: tbf-capped uplinks plus a userspace delay line).
Floor = bytes each node must upload / link rate: S for the pair swap, 2(N−1)/N·S for the
ring. A model t = α·messages + bytes/β is fit per method and extrapolated to 100 and
1000 replicas.

    sudo python -m benchmarks.comm_sync                      # both link kinds, N = 2 4 8
    python -m benchmarks.comm_sync --links loopback --ns 2 4 # no root needed
    # own netns names; delay line's env:
    sudo python -m benchmarks.comm_sync --wan-prefix nb --delay-python /opt/nfq/bin/python

Writes results/<name>.json, then the TXT and PNG generated from that JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import wire
from benchmarks.harness import Harness, bench_parser, own_flags, parse, save_figure

ROOT = Path(__file__).resolve().parents[1]
WAN = ROOT / "launch" / "wan_emulation.sh"


def fit_alpha_beta(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Least squares of t = α·messages + bytes/β over (messages, bytes, seconds), α, 1/β >= 0."""
    a = np.array([[m, b] for m, b, _ in points], dtype=float)
    t = np.array([s for _, _, s in points], dtype=float)
    coef, *_ = np.linalg.lstsq(a, t, rcond=None)
    if coef[0] < 0:  # latency not resolvable: bandwidth only
        coef = np.array([0.0, float(np.dot(a[:, 1], t) / np.dot(a[:, 1], a[:, 1]))])
    if coef[1] <= 0:
        coef = np.array([float(np.dot(a[:, 0], t) / np.dot(a[:, 0], a[:, 0])), 1e-30])
    return float(coef[0]), float(1.0 / coef[1])


def fragment_sizes(model_name: str, fragments: int) -> list[int]:
    """Parameters per Streaming DiLoCo fragment of a shipped model config (built on the meta device)."""
    import torch
    from omegaconf import OmegaConf

    from decentrain.algorithms.outer.updates import fragment_param_names
    from decentrain.models.factory import ModelConfig, build_model

    raw = OmegaConf.load(ROOT / "conf" / "model" / f"{model_name}.yaml")
    raw.pop("defaults", None)
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ModelConfig), raw))
    with torch.device("meta"):
        model = build_model(cfg)
    numel = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    return [sum(numel[n] for n in frag) for frag in fragment_param_names(numel, cfg.num_layers, fragments)]


# --------------------------------------------------------------------------- one worker
def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    from decentrain.core.comm.pair_exchange import PairExchange
    from decentrain.core.comm.pairing import gossip_groups, group_of
    from decentrain.core.world import init_world

    torch.set_num_threads(1)
    world = init_world(backend="gloo", timeout_s=900)
    n, rank = world.world_size, world.rank
    duplex = PairExchange(world).full_duplex()
    shared = PairExchange(world)

    def timed(fn) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        mine = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)  # a sync is as slow as its slowest rank
        return float(mine.item())

    out = []
    for numel in args.sizes:
        payload = torch.randn(numel, generator=torch.Generator().manual_seed(rank))
        frag = payload[: max(1, int(numel * args.fragment_share))].clone()
        methods = {  # name -> (sync, the tensor it moves)
            "pair": (lambda t: duplex.exchange([payload], group_of(rank, gossip_groups(t, n, seed=0)), t), payload),
            "ring": (lambda t: dist.all_reduce(payload), payload),
            "fragment": (lambda t: dist.all_reduce(frag), frag),
        }
        if n == 2:
            methods["pair_1pg"] = (lambda t: shared.exchange([payload], (0, 1), t), payload)
        for name, (fn, sent) in methods.items():
            # warm-up on the very rounds timed below: each pair's connection exists and its TCP window
            # has grown, as in a long run that has met every partner (a first contact would add
            # slow start, ~log2(bytes / 14 KB) round trips, which a fixed ring never pays again)
            for r in range(args.repeats):
                fn(r)
            times = [timed(lambda r=r: fn(r)) for r in range(args.repeats)]
            out.append(
                {"method": name, "n": n, "numel": numel, "bytes": sent.numel() * sent.element_size(), "times": times}
            )
            if rank == 0:
                print(
                    f"  N={n} {name:9s} {numel * 4 / 1e6:7.1f} MB  median {statistics.median(times):.3f}s", flush=True
                )
    if rank == 0:
        Path(args.out).write_text(json.dumps(out))
    world.shutdown()


# --------------------------------------------------------------------------- orchestration
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(link: str, n: int, args: argparse.Namespace) -> list[dict]:
    out = Path(tempfile.mkdtemp()) / "r.json"
    port = 29600 + n if link == "emulated" else _free_port()  # loopback is shared with other jobs on this host
    addr = "10.77.0.1" if link == "emulated" else "127.0.0.1"
    if link == "emulated":
        subprocess.run(
            [str(WAN), "up", str(n), args.rate, str(args.delay_ms)],
            check=True,
            env={**os.environ, "WAN_PREFIX": args.wan_prefix, "PYTHON": args.delay_python or sys.executable},
        )
        if not args.slow_start_after_idle:
            # Linux restarts TCP slow start on a connection idle for one RTO. Syncs come after
            # idle compute, so on a 100 ms RTT link every sync re-ramps the window (~0.6 s);
            # long-lived training links turn this off. The setting is per namespace.
            for r in range(n):
                subprocess.run(
                    [
                        "ip",
                        "netns",
                        "exec",
                        f"{args.wan_prefix}{r}",
                        "sysctl",
                        "-qw",
                        "net.ipv4.tcp_slow_start_after_idle=0",
                    ],
                    check=True,
                )
    procs = []
    try:
        for r in range(n):
            env = {
                **os.environ,
                "RANK": str(r),
                "WORLD_SIZE": str(n),
                "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": addr,
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
                "GLOO_SOCKET_IFNAME": "eth0" if link == "emulated" else "lo",
            }
            cmd = [
                sys.executable,
                "-m",
                "benchmarks.comm_sync",
                "--worker",
                "--out",
                str(out),
                "--repeats",
                str(args.repeats),
                "--fragments",
                str(args.fragments),
                "--fragment-share",
                repr(args.fragment_share),
                "--sizes",
                *map(str, args.sizes),
            ]
            if link == "emulated":
                cmd = ["ip", "netns", "exec", f"{args.wan_prefix}{r}", *cmd]
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env))
        for p in procs:
            if p.wait(timeout=args.timeout) != 0:
                raise RuntimeError(f"{link} N={n}: a worker exited with {p.returncode}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        if link == "emulated":
            subprocess.run([str(WAN), "down"], env={**os.environ, "WAN_PREFIX": args.wan_prefix}, check=False)
    return [{**row, "link": link} for row in json.loads(out.read_text())]


def rate_bytes_per_s(rate: str) -> float:
    units = {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
    for u, f in units.items():
        if rate.lower().endswith(u):
            return float(rate[: -len(u)]) * f / 8
    raise ValueError(f"--rate={rate!r}: use e.g. 100mbit")


def summarise(rows: list[dict], args: argparse.Namespace) -> dict:
    link_rate = rate_bytes_per_s(args.rate)
    for row in rows:
        msgs, up = wire(row["method"], row["n"], row["bytes"])
        row["median_s"] = statistics.median(row["times"])
        row["upload_bytes"] = up
        if row["link"] == "emulated":
            row["floor_s"] = up / link_rate
            row["vs_floor"] = row["median_s"] / row["floor_s"]
    fits, extrap = {}, {}
    for link in sorted({r["link"] for r in rows}):
        for method in ("pair", "ring", "fragment"):
            pts = [
                (*wire(method, r["n"], r["bytes"]), r["median_s"])
                for r in rows
                if r["link"] == link and r["method"] == method
            ]
            if len(pts) < 2:
                continue
            alpha, beta = fit_alpha_beta(pts)
            fits[f"{link}/{method}"] = {"alpha_s": alpha, "beta_bytes_per_s": beta}
            sent = max(r["bytes"] for r in rows if r["link"] == link and r["method"] == method)  # at the full payload
            for n in (100, 1000):
                m, b = wire(method, n, sent)
                extrap[f"{link}/{method}/N={n}"] = alpha * m + b / beta
    return {"rows": rows, "fits": fits, "extrapolated_s": extrap}


def table(record: dict) -> str:
    """The TXT, generated from the JSON record alone."""
    cfg, summary, env = record["config"], record["figures"], record["hardware"]
    big = max(cfg["sizes"])
    lines = [
        f"{record['name']} @ {record['git_sha'][:12]}: {env['cpu']}, {env['cpu_count']} cores (shared; loopback "
        "times are CPU-bound)",
        f"payload {big * 4 / 1e6:.1f} MB ({big / 1e6:.1f}M fp32 params); fragment = {cfg['fragment_share']:.3f} of "
        f"it; link {cfg['rate']}, +{cfg['delay_ms']} ms each way (emulated); TCP slow start after idle: "
        f"{'on' if cfg['slow_start_after_idle'] else 'off'}; {cfg['repeats']} timed repeats per row",
        f"{'link':9s} {'N':>2s} {'method':9s} {'MB sent':>8s} {'median s':>9s} {'floor s':>8s} {'x floor':>8s}   "
        "all runs",
    ]
    for r in sorted(summary["rows"], key=lambda r: (r["link"], r["n"], r["method"])):
        if r["numel"] != big:
            continue
        floor = f"{r['floor_s']:8.2f} {r['vs_floor']:8.2f}" if "floor_s" in r else f"{'-':>8s} {'-':>8s}"
        lines.append(
            f"{r['link']:9s} {r['n']:2d} {r['method']:9s} {r['bytes'] / 1e6:8.2f} {r['median_s']:9.3f} {floor}   "
            f"{', '.join(f'{t:.2f}' for t in r['times'])}"
        )
    lines.append("fit t = α·messages + bytes/β, extrapolated to the full payload:")
    for key, f in summary["fits"].items():
        e100, e1000 = summary["extrapolated_s"][f"{key}/N=100"], summary["extrapolated_s"][f"{key}/N=1000"]
        lines.append(
            f"  {key:18s} α={f['alpha_s'] * 1e3:8.2f} ms  β={f['beta_bytes_per_s'] / 1e6:8.1f} MB/s  N=100: "
            f"{e100:8.2f}s  N=1000: {e1000:8.2f}s"
        )
    load = summary.get("load", {})
    lines.append(
        f"wall {summary['wall_s']:.0f} s; nice {load.get('nice', '?')}, 1-min load avg "
        f"{load.get('loadavg_start', ['?'])[0]} at start, {load.get('loadavg_end', ['?'])[0]} at end"
    )
    return "\n".join(lines)


def plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = record["figures"]
    big = max(record["config"]["sizes"])
    links = sorted({r["link"] for r in summary["rows"]})
    fig, axes = plt.subplots(1, len(links), figsize=(6 * len(links), 4), squeeze=False)
    for ax, link in zip(axes[0], links):
        for method in ("pair", "ring", "fragment", "pair_1pg"):
            pts = sorted(
                (r["n"], r["median_s"], r.get("floor_s"))
                for r in summary["rows"]
                if r["link"] == link and r["method"] == method and r["numel"] == big
            )
            if not pts:
                continue
            (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=method)
            if pts[0][2] is not None:
                ax.plot([p[0] for p in pts], [p[2] for p in pts], ":", color=line.get_color(), label=f"{method} floor")
        ax.set(
            title=f"{link}: {big * 4 / 1e6:.0f} MB sync",
            xlabel="workers N",
            ylabel="seconds",
            xticks=sorted({r["n"] for r in summary["rows"]}),
        )
        ax.legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def main() -> None:
    ap = bench_parser(__doc__.splitlines()[0], seeds=None)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="")
    ap.add_argument("--links", nargs="+", default=["loopback", "emulated"], choices=["loopback", "emulated"])
    ap.add_argument("--ns", nargs="+", type=int, default=[2, 4, 8])
    ap.add_argument(
        "--sizes", nargs="+", type=int, default=[1_000_000, 25_000_000], help="payload sizes in fp32 elements"
    )
    ap.add_argument("--fragments", type=int, default=4)
    ap.add_argument(
        "--fragment-model",
        default=None,
        help=(
            "size the fragment as this conf/model config's largest "
            "Streaming DiLoCo fragment (default: 1/fragments of the payload)"
        ),
    )
    ap.add_argument("--fragment-share", type=float, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rate", default="100mbit")
    ap.add_argument("--delay-ms", type=float, default=50.0)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument(
        "--slow-start-after-idle",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="keep Linux's TCP slow-start restart after idle in the emulated namespaces (default: off)",
    )
    ap.add_argument("--name", default="comm_sync", help="results file name under benchmarks/results/")
    ap.add_argument(
        "--wan-prefix",
        default="dtc",
        help=(
            "network namespace prefix for the emulated links (WAN_PREFIX); "
            "pick your own so another setup's namespaces are left alone"
        ),
    )
    ap.add_argument(
        "--delay-python", default=None, help="python with NetfilterQueue for the delay line (default: this one)"
    )
    args = parse(ap)
    if args.worker:
        return worker(args)
    hz = Harness(args.name, __file__, own_flags(args), allow_dirty=args.allow_dirty, fresh=args.fresh, smoke=args.smoke)
    if any(n % 2 for n in args.ns):
        ap.error("--ns: every N must be even (pairs)")
    if args.fragment_model:
        args.fragment_sizes = fragment_sizes(args.fragment_model, args.fragments)
        args.fragment_share = max(args.fragment_sizes) / sum(args.fragment_sizes)
    else:
        args.fragment_share = 1.0 / args.fragments
    rows = []
    load_start = os.getloadavg()
    t0 = time.perf_counter()
    for link in args.links:
        for n in args.ns:
            print(f"[comm_sync] {link} N={n}", flush=True)
            rows += run_world(link, n, args)
    summary = summarise(rows, args)
    summary["wall_s"] = time.perf_counter() - t0
    # the pair path's checksum/copies and the userspace delay line need CPU: record what they competed with
    summary["load"] = {"nice": os.nice(0), "loadavg_start": load_start, "loadavg_end": os.getloadavg()}
    paths = hz.write(summary, table, plot, config=own_flags(args))
    print(paths["txt"].read_text())
    print(f"in {summary['wall_s']:.0f}s")


if __name__ == "__main__":
    main()
