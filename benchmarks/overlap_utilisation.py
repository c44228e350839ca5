"""overlap_utilisation: compute utilisation and wall time to a target loss, with and without
`algorithm.overlap` (the one-step-delayed outer update), for DiLoCo and NoLoCo on a slow link.

Each run is the library's own training (`Trainer` + the algorithm's hooks) with 2 replicas as
threads over the in-process transport, wrapped in `EmulatedLink`: every sync completes no
earlier than the time it would take on a 100 Mbit/s link with 50 ms each way, for a payload
the size of llama_125m's fp32 weights (498 MB), whatever the tiny model really sends.
    utilisation = Σ time in the inner steps (forward, backward, AdamW) ÷ Σ step wall time
(per replica, evaluation and checkpoints excluded; the outer step, the wait for the link and the
final drain count as idle). Wall time to target: the step wall time summed up to the first
evaluation at or below the target, which for both arms of a method and seed is the final eval
loss of its own run without overlap (so a delay that costs loss shows as a target the overlap arm
reaches late or never, not as a looser target). Beside the utilisation gain, the loss cost of the
delay: the paired (same seed) final eval loss with overlap minus without.

Departures, named:
  - the link is emulated in-process (a sleep until the sync's link time has passed since it
    was sent), not launch/wan_emulation.sh's network namespaces: no TCP, no kernel queueing;
  - time-compressed: 498 MB at 100 Mbit/s plus latency is ~40 s; that is played faster, so
    that one sync lasts `--sync_over_round` times a round's compute (H inner steps; measured on
    the run's first round, since the box is shared and its step time moves with the load), i.e.
    the 125M model on hardware whose round of H steps takes 40 s / sync_over_round. The run with
    overlap reuses the compression its seed's run without overlap set: the same link. Utilisation
    depends on that ratio, not on the absolute times; each run reports the ratio it ran at
    (its median inner step × H over the played sync time) and the compression used;
  - the model trained is a tiny Llama on the offline corpus (the payload size is emulated).

    nice -n 10 env OMP_NUM_THREADS=1 python -m benchmarks.overlap_utilisation          # what results/ holds
    python -m benchmarks.overlap_utilisation --seeds 1 --steps 40 --allow-dirty          # smoke

Writes results/overlap_utilisation.{json,txt,png}.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from benchmarks.harness import (
    RESULTS,
    Harness,
    bench_parser,
    clean_sha,
    fmt,
    mean_std,
    own_flags,
    parse,
    reanalyse,
    save_figure,
)
from decentrain.core.comm.transport import Transport, Work

PAYLOAD_125M = 124_439_808 * 4  # llama_125m's parameters (conf/model/llama_125m.yaml) in fp32


class EmulatedLink(Transport):
    """A `Transport` whose syncs take at least a slow link's time: one-way latency per message in
    sequence plus the bytes each node uploads over the rate (the floor comm_sync reports against).

    The wait happens where the result is needed (a collective's `wait`, the end of an exchange),
    so a sync started early overlaps whatever runs meanwhile, as on a real link.
    """

    def __init__(self, inner: Transport, payload_bytes: float, rate_bps: float, one_way_s: float, clock: "LinkClock"):
        self.inner, self.rank, self.world_size = inner, inner.rank, inner.world_size
        self.payload_bytes, self.rate_bps, self.one_way_s, self.clock = payload_bytes, rate_bps, one_way_s, clock
        self.link_seconds = 0.0  # emulated link time of every sync started, unscaled
        self.played_seconds = 0.0  # the same, as played (time-compressed)

    @property
    def stats(self):
        return self.inner.stats

    def _link_time(self, messages: float, upload_bytes: float) -> float:
        seconds = messages * self.one_way_s + upload_bytes * 8 / self.rate_bps
        played = seconds / self.clock.scale_for(seconds)
        self.link_seconds += seconds
        self.played_seconds += played
        return played

    def ring_time(self) -> float:
        n = self.world_size  # ring all-reduce: 2(N−1) messages in sequence, 2(N−1)/N·S uploaded
        return self._link_time(2 * (n - 1), 2 * (n - 1) / n * self.payload_bytes)

    def exchange(self, tensors, group, round_idx):
        done = time.perf_counter() + self._link_time(1, self.payload_bytes * (len(group) - 1))
        out = self.inner.exchange(tensors, group, round_idx)
        time.sleep(max(0.0, done - time.perf_counter()))
        return out

    def skip_round(self, group, round_idx):
        self.inner.skip_round(group, round_idx)

    def all_reduce_sum(self, flat: torch.Tensor) -> Work:
        return _Until(self.inner.all_reduce_sum(flat), time.perf_counter() + self.ring_time())

    def all_gather(self, t):
        out, work = self.inner.all_gather(t)
        return out, _Until(work, time.perf_counter() + self.ring_time())

    def all_gather_bytes(self, data, max_bytes=64 << 20):
        return self.inner.all_gather_bytes(data, max_bytes)

    def all_reduce_min(self, value):
        return self.inner.all_reduce_min(value)


class _Until:
    def __init__(self, work: Work, done: float):
        self.work, self.done = work, done

    def wait(self):
        out = self.work.wait()
        time.sleep(max(0.0, self.done - time.perf_counter()))
        return out


class LinkClock:
    """The time compression all links of a run share: `scale` fixed, or set at the first sync so
    that it lasts `ratio` × (median inner step so far × H), the round's compute."""

    def __init__(
        self, scale: float | None = None, ratio: float | None = None, h: int = 1, compute: "ComputeClock | None" = None
    ):
        if (scale is None) == (ratio is None):
            raise ValueError("LinkClock needs exactly one of scale and ratio")
        self.scale, self.ratio, self.h, self.compute = scale, ratio, h, compute
        self._lock = threading.Lock()

    def scale_for(self, link_seconds: float) -> float:
        with self._lock:
            if self.scale is None:
                self.scale = link_seconds / (self.ratio * self.h * self.compute.median())
            return self.scale


class ComputeClock:
    """Seconds each replica thread spends in `Trainer.train_step` (the inner step's compute)."""

    def __init__(self):
        self.seconds: dict[str, list[float]] = {}
        self._lock = threading.Lock()

    def wrap(self, train_step):
        def timed(trainer, model):
            t0 = time.perf_counter()
            loss = train_step(trainer, model)
            dt = time.perf_counter() - t0
            with self._lock:
                self.seconds.setdefault(threading.current_thread().name, []).append(dt)
            return loss

        return timed

    def median(self) -> float:
        with self._lock:
            return statistics.median(t for ts in self.seconds.values() for t in ts)


def _config(job: dict[str, Any]):
    from decentrain.config import config_from_dict

    algo = {"name": job["method"], "inner_steps": job["h"], "overlap": job["overlap"]}
    if job["method"] == "noloco":
        algo.update(stall_s=None, deadline_s=600.0)
    return config_from_dict(
        {
            "algorithm": algo,
            "model": {
                "hidden_size": job["hidden"],
                "num_layers": job["layers"],
                "num_heads": 2,
                "intermediate_size": 2 * job["hidden"],
                "max_seq_len": job["seq_len"],
            },
            "data": {"seq_len": job["seq_len"], "max_bytes_per_domain": 60_000},
            "optim": {"lr": 2e-3, "warmup_steps": 10},
            "train": {
                "steps": job["steps"],
                "global_batch_size": 2 * job["micro_batch"],
                "micro_batch_size": job["micro_batch"],
                "eval_every": job["h"],
                "eval_batches": 2,
                "checkpoint_every": 10**6,
                "threads": 1,
                "seed": job["seed"],
                "device": "cpu",
            },
            "logger": {"progress": False, "console": False, "log_every": job["h"]},
        }
    )


def run(job: dict[str, Any]) -> dict[str, Any]:
    """One training run of 2 replicas over the emulated link; per-replica utilisation and the eval curve."""
    from decentrain.algorithms.pretraining import inprocess_replicas
    from decentrain.algorithms.pretraining.trainer import Trainer
    from decentrain.core.metrics import read_jsonl

    torch.set_num_threads(1)
    links: list[EmulatedLink] = []
    clock = ComputeClock()
    if job.get("time_compression") is not None:  # the paired run of the same seed: the very same link
        link_clock = LinkClock(scale=job["time_compression"])
    else:
        link_clock = LinkClock(ratio=job["sync_over_round"], h=job["h"], compute=clock)

    def linked(transport: Transport) -> EmulatedLink:
        links.append(EmulatedLink(transport, PAYLOAD_125M, job["rate_mbit"] * 1e6, job["one_way_ms"] / 1e3, link_clock))
        return links[-1]

    train_step = Trainer.train_step
    Trainer.train_step = clock.wrap(train_step)  # instrumentation only: the step itself is the library's
    try:
        with tempfile.TemporaryDirectory(prefix="overlap_util_") as d:
            runs = inprocess_replicas.run_replicas_in_process(_config(job), 2, Path(d), wrap_transport=linked)
            evals = [(r["step"], r["eval/loss"]) for r in read_jsonl(Path(d) / "metrics.jsonl") if "eval/loss" in r]
    finally:
        Trainer.train_step = train_step
    replicas = []
    for rank, r in enumerate(runs):
        compute = clock.seconds[f"replica-{rank}"]
        wall = sum(r.step_times)
        replicas.append(
            {"compute_s": sum(compute), "wall_s": wall, "utilisation": sum(compute) / wall, "step_wall_s": r.step_times}
        )
    round_compute = statistics.median(clock.seconds["replica-0"]) * job["h"]
    syncs = job["steps"] // job["h"]
    sync = links[0].played_seconds / syncs
    return {
        "time_compression": link_clock.scale,
        "link_s_per_sync_unscaled": links[0].link_seconds / syncs,
        "replicas": replicas,
        "evals": evals,
        "final_eval": evals[-1][1],
        "utilisation": statistics.fmean(x["utilisation"] for x in replicas),
        "sync_s": sync,
        "round_compute_s": round_compute,
        "sync_over_round": sync / round_compute,
    }


def time_to(result: dict[str, Any], target: float) -> float | None:
    """Step wall time (replica 0) summed up to the first evaluation at or below `target`."""
    steps = result["replicas"][0]["step_wall_s"]
    for step, loss in result["evals"]:
        if loss <= target:
            return sum(steps[:step])
    return None


def _mean_std_or_none(values: Sequence[float | None]) -> dict[str, Any] | None:
    kept = [v for v in values if v is not None]
    return mean_std(kept) if kept else None


def summarise(results: dict[str, list[dict[str, Any]]], methods: Sequence[str], seeds: Sequence[int]) -> dict[str, Any]:
    """Per method: each arm's utilisation, wall time to the no-overlap run's final loss (same seed), the speed-up
    where both reach it, the utilisation gain and the loss cost of the delay (paired, overlap minus no overlap)."""
    out: dict[str, Any] = {}
    for m in methods:
        off, on = results[f"{m}/off"], results[f"{m}/on"]
        targets = [a["final_eval"] for a in off]  # each arm's target: its own no-overlap run's final loss
        times = {name: [time_to(r, t) for r, t in zip(rs, targets)] for name, rs in (("off", off), ("on", on))}
        row: dict[str, Any] = {}
        for name, rs in (("off", off), ("on", on)):
            row[name] = {
                "utilisation": mean_std([r["utilisation"] for r in rs]),
                "wall_to_target_s": _mean_std_or_none(times[name]),
                "reached_target": sum(t is not None for t in times[name]),
                "final_eval": mean_std([r["final_eval"] for r in rs]),
                "sync_over_round": mean_std([r["sync_over_round"] for r in rs]),
            }
        row["speedup_to_target"] = _mean_std_or_none(
            [a / b if a is not None and b is not None else None for a, b in zip(times["off"], times["on"])]
        )
        row["utilisation_gain"] = mean_std([b["utilisation"] - a["utilisation"] for a, b in zip(off, on)])
        row["loss_cost_of_delay"] = mean_std([b["final_eval"] - a["final_eval"] for a, b in zip(off, on)])
        row["loss_cost_of_delay_pct"] = mean_std(
            [100 * (b["final_eval"] / a["final_eval"] - 1) for a, b in zip(off, on)]
        )
        row["target_eval"] = targets
        out[m] = row
    return out


def text_report(figures: dict[str, Any], config: dict[str, Any]) -> str:
    lines = [
        f"overlap_utilisation ({config['seeds']} seeds; link {config['rate_mbit']} Mbit/s + {config['one_way_ms']} "
        f"ms each way, {PAYLOAD_125M / 1e6:.0f} MB payload (llama_125m fp32), played so one sync = "
        f"{config['sync_over_round']} x a round's compute; H={config['h']}, "
        f"{config['steps']} steps, 2 replicas in-process)",
        f"{'method':8s} {'overlap':7s} {'utilisation':>17s} {'wall to target (s)':>20s} {'final eval':>17s} "
        f"{'sync/round':>14s}",
    ]
    n = len(figures["seeds"])
    for m, row in figures["summary"].items():
        for name in ("off", "on"):
            r = row[name]
            wall = "never" if r["wall_to_target_s"] is None else fmt(r["wall_to_target_s"], 1)
            lines.append(
                f"{m:8s} {name:7s} {fmt(r['utilisation'], 3):>17s} {wall:>20s} "
                f"{fmt(r['final_eval'], 3):>17s} {fmt(r['sync_over_round'], 2):>14s}"
            )
        if "utilisation_gain" in row:  # records from before the per-arm target have no cost figures
            speed = row["speedup_to_target"]
            lines.append(
                f"{m:8s} overlap: utilisation {fmt(row['utilisation_gain'], 3)} higher; loss cost of the delay "
                f"{fmt(row['loss_cost_of_delay'], 4)} final eval ({fmt(row['loss_cost_of_delay_pct'], 2)} %); "
                f"reaches the no-overlap run's final loss in {row['on']['reached_target']}/{n} seeds"
                + ("" if speed is None else f", wall-time speed-up there {fmt(speed, 2)}x")
            )
        else:
            lines.append(f"{m:8s} wall-time speed-up to target with overlap: {fmt(row['speedup_to_target'], 2)}x")
    return "\n".join(lines)


def plot(figures: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(figures["summary"])
    fig, axes = plt.subplots(1, len(methods) + 1, figsize=(5 * (len(methods) + 1), 4))
    ax = axes[0]
    xs = range(len(methods))
    for i, name in enumerate(("off", "on")):
        vals = [figures["summary"][m][name]["utilisation"] for m in methods]
        ax.bar(
            [x + 0.4 * i for x in xs],
            [v["mean"] for v in vals],
            0.4,
            yerr=[v["std"] for v in vals],
            label=f"overlap {name}",
        )
    ax.axhline(0.9, color="k", ls=":", lw=1)
    ax.set_xticks([x + 0.2 for x in xs], methods)
    ax.set_ylabel("compute utilisation")
    ax.set_ylim(0, 1)
    ax.legend()
    for ax, m in zip(axes[1:], methods):
        for name in ("off", "on"):
            r = figures["runs"][f"{m}/{name}"][0]
            steps = r["replicas"][0]["step_wall_s"]
            ax.plot(
                [sum(steps[:s]) for s, _ in r["evals"]],
                [loss for _, loss in r["evals"]],
                marker="o",
                ms=3,
                label=f"overlap {name}",
            )
        ax.set_xlabel("wall seconds (steps only)")
        ax.set_ylabel("eval loss")
        ax.set_title(f"{m} (seed {figures['seeds'][0]})")
        ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=120)


def text(record: dict[str, Any]) -> str:
    figures = record["figures"]
    out = text_report(figures, record["config"])
    if "summary_recomputed" in figures:
        out += (
            f"\n(runs at {figures['git']['sha'][:12]}; summary recomputed at "
            f"{figures['summary_recomputed']['sha'][:12]})"
        )
    return out


def plot_record(record: dict[str, Any], path: Path) -> None:
    plot(record["figures"], path)


def resummarise(allow_dirty: bool) -> None:
    """The committed runs, summarised again (targets and costs as defined now); the runs' provenance is kept."""
    sha, dirty = clean_sha(allow_dirty)

    def figures(record: dict[str, Any]) -> dict[str, Any]:
        f = record["figures"]
        f["summary"] = summarise(f["runs"], record["config"]["methods"], f["seeds"])
        f["summary_recomputed"] = {"sha": sha, "dirty": dirty}
        return f

    print(reanalyse(RESULTS / "overlap_utilisation.json", figures, text, plot_record, allow_dirty)["txt"].read_text())


def main(argv: Sequence[str] | None = None) -> None:
    ap = bench_parser(__doc__.split("\n")[0], smoke={"seeds": 1, "steps": 40})
    ap.add_argument("--methods", nargs="+", default=["diloco", "noloco"])
    ap.add_argument("--steps", type=int, default=240)
    ap.add_argument("--h", type=int, default=10)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--seq_len", type=int, default=32)
    ap.add_argument("--micro_batch", type=int, default=4)
    ap.add_argument("--rate_mbit", type=float, default=100.0)
    ap.add_argument("--one_way_ms", type=float, default=50.0)
    ap.add_argument("--sync_over_round", type=float, default=0.6)
    ap.add_argument(
        "--resummarise",
        action="store_true",
        help="recompute the summary of the committed result's runs (no training) with this code",
    )
    args = parse(ap, argv)
    if args.resummarise:
        return resummarise(args.allow_dirty)
    config = {k: v for k, v in own_flags(args).items() if k != "resummarise"}
    hz = Harness(
        "overlap_utilisation", __file__, config, allow_dirty=args.allow_dirty, fresh=args.fresh, smoke=args.smoke
    )
    sha, dirty = hz.sha, hz.dirty
    seeds = list(range(args.seeds))
    results: dict[str, list[dict[str, Any]]] = {}
    for seed in seeds:  # the variants of a seed run back to back: a paired comparison under the same load
        for m in args.methods:
            compression = None  # set by the run without overlap, reused by its pair: both see the same link
            for overlap in (False, True):
                job = {**config, "method": m, "overlap": overlap, "seed": seed, "time_compression": compression}
                r = run(job)
                compression = r["time_compression"]
                results.setdefault(f"{m}/{'on' if overlap else 'off'}", []).append(r)
                print(
                    f"seed {seed} {m:7s} overlap={overlap!s:5s} utilisation {r['utilisation']:.3f} "
                    f"final eval {r['final_eval']:.4f} sync/round {r['sync_over_round']:.2f} "
                    f"(time x1/{r['time_compression']:.0f})",
                    flush=True,
                )
    figures = {
        "summary": summarise(results, args.methods, seeds),
        "runs": results,
        "seeds": seeds,
        "git": {"sha": sha, "dirty": dirty},
    }
    print(hz.write(figures, text, plot_record)["txt"].read_text())


if __name__ == "__main__":
    main()
