"""The harness every reproduction benchmark shares: runs, records, command line, tails.

It runs each (config, seed) job once, checkpoints its result to a cache so an interrupted
benchmark resumes where it stopped, reports mean ± std over seeds, and writes the JSON and
then the TXT and PNG *generated from that JSON* in the same run, so they cannot disagree.

Every result is one record in the one schema (`benchmarks/record.py`: `validate_record`,
`upgrade_record`): the resolved config, a clean git SHA (a dirty tree is refused unless
`allow_dirty`, and the result is then marked `not_for_commit`), the command line, versions,
hardware and the load the runtimes were measured under. Paths are stored relative to the repository.

Comparisons go through the one tuning and decision protocol, `benchmarks/protocol.py` (re-exported here):
every arm tuned over all its outer settings on >= 2 tuning seeds, >= 8 paired evaluation seeds, a
`DecisionRule` fixed before the run, verdicts computed from the record (docs/benchmarks.md).

One command line (`bench_parser` + `parse`): `--seeds N`, `--smoke` (the script's reduced config;
written under runs/bench_smoke, never over a committed result), `--fresh` (ignore the run cache),
`--allow-dirty`, then each script's own flags. Headline figures of committed results have baselines
with tolerances (`benchmarks/baselines/`), checked by tests/unit/test_benchmark_baselines.py.

    python -m benchmarks.harness --upgrade benchmarks/results/*.json   # older layouts -> the one schema
    python -m benchmarks.harness --validate benchmarks/results/*.json

A cache entry is keyed by the job's config and the git tree hashes of the code it runs
(decentrain/, recipes/, conf/ and the benchmark script), so a resumed run never reuses a
result that older code produced, and unrelated commits (README, results) don't invalidate it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

# a script imports everything it needs from the harness, so these are re-exported:
# the one tuning and decision protocol (benchmarks/protocol.py, docs/benchmarks.md),
from benchmarks.protocol import (  # noqa: F401
    Axis,
    DecisionRule,
    check_seeds,
    consistency,
    decide,
    decision,
    decisions_in,
    describe,
    describe_tuning,
    detectable,
    grid_search,
    preregister,
    recompute,
    seeds_needed,
)

# the record's pieces,
from benchmarks.record import (  # noqa: F401
    RESULTS,
    ROOT,
    SCHEMA,
    SCHEMA_ID,
    _git,
    command_line,
    git_state,
    hardware,
    provenance,
    upgrade_record,
    validate_record,
    versions,
)

# and the scale of a pre-training comparison: model sizes, steps for tokens per parameter, the corpus
# (benchmarks/scale.py)
from benchmarks.scale import (  # noqa: F401
    MODEL_SIZES,
    add_corpus_flags,
    corpus_facts,
    corpus_of,
    divergence,
    model_params,
    model_section,
    recipe_sections,
    steps_for,
)

SMOKE_DIR = ROOT / "runs" / "bench_smoke"  # a --smoke run writes here, never over a committed result
CACHE_DIR = ROOT / "runs" / "bench_cache"  # runs/ is git-ignored: caches are never committed
CODE_PATHS = ("decentrain", "recipes", "conf")


# -- statistics -------------------------------------------------------------------------
def mean_std(values: Sequence[float]) -> dict[str, Any]:
    """Mean and sample standard deviation (ddof=1; 0 for a single value) with n and the values."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("mean_std needs at least one value")
    std = statistics.stdev(vals) if len(vals) > 1 else 0.0
    return {"mean": statistics.fmean(vals), "std": std, "n": len(vals), "values": vals}


def fmt(ms: dict[str, Any], digits: int = 4) -> str:
    return f"{ms['mean']:.{digits}f} ± {ms['std']:.{digits}f}"


# -- git / environment ------------------------------------------------------------------
class DirtyTreeError(RuntimeError):
    pass


def clean_sha(allow_dirty: bool = False, root: Path = ROOT) -> tuple[str, bool]:
    """(sha, not_for_commit). Refuses a dirty tree unless allow_dirty, which marks the result."""
    sha, dirty = git_state(root)
    if dirty and not allow_dirty:
        raise DirtyTreeError(
            f"the working tree {'has uncommitted changes' if sha != 'unknown' else 'is not a readable git checkout'}"
            ": commit them first (or pass --allow-dirty: "
            "the result is then marked not_for_commit)"
        )
    return sha, dirty


def code_version(script: str | Path, root: Path = ROOT) -> str:
    """Hash of the git trees/blobs the benchmark runs (HEAD's); with a dirty tree, of the files' contents too."""
    parts = []
    for p in (*CODE_PATHS, relpath(script, root)):
        try:
            parts.append(_git("rev-parse", f"HEAD:{p}", root=root))
        except subprocess.CalledProcessError:
            parts.append("missing:" + p)
    try:
        diff = _git("diff", "HEAD", "--", *CODE_PATHS, str(relpath(script, root)), root=root)
    except (OSError, subprocess.CalledProcessError):  # no git here: the key still names the script
        diff = Path(script).read_text() if Path(script).exists() else ""
    if diff:  # uncommitted code must not share a cache key with HEAD's (other dirty files don't matter)
        parts.append(diff)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


# -- paths ------------------------------------------------------------------------------
def relpath(p: str | Path, root: Path = ROOT) -> str:
    """A path inside the repository as a repo-relative POSIX string; others unchanged."""
    path = Path(p)
    if not path.is_absolute():
        return path.as_posix()
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(p)


def relativize(obj: Any, root: Path = ROOT) -> Any:
    """Recursively rewrite absolute paths under the repository (alone or inside strings) as relative."""
    if isinstance(obj, dict):
        return {k: relativize(v, root) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [relativize(v, root) for v in obj]
    if isinstance(obj, Path):
        return relpath(obj, root)
    if isinstance(obj, str):
        prefix = str(root.resolve()) + "/"
        return obj.replace(prefix, "") if prefix in obj else obj
    return obj


def config_key(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


# -- the resumable run cache ------------------------------------------------------------
class RunCache:
    """Append-only JSONL of finished runs: one line per (config, code version) key."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.entries: dict[str, Any] = {}
        self.seconds: dict[str, float] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                    self.entries[rec["key"]] = rec["result"]
                    if "seconds" in rec:
                        self.seconds[rec["key"]] = float(rec["seconds"])
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a line torn by a kill mid-write: that run simply reruns

    def get(self, key: str) -> Any | None:
        return self.entries.get(key)

    def put(self, key: str, config: dict[str, Any], result: Any, seconds: float | None = None) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        rec = {"key": key, "config": config, "result": result}
        if seconds is not None:
            rec["seconds"] = seconds
        with self.path.open("a") as f:
            f.write(json.dumps(rec, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.entries[key] = result
        if seconds is not None:
            self.seconds[key] = seconds


class Harness:
    """One benchmark's run: jobs through the cache, then JSON -> TXT + PNG."""

    def __init__(
        self,
        name: str,
        script: str | Path,
        config: dict[str, Any],
        *,
        allow_dirty: bool = False,
        cache_dir: Path = CACHE_DIR,
        root: Path = ROOT,
        fresh: bool = False,
        smoke: bool = False,
    ):
        self.name, self.root = name, root
        self.smoke = smoke
        self.config = relativize(config, root)
        self.sha, self.dirty = clean_sha(allow_dirty or self.smoke, root)
        self.not_for_commit = self.dirty or self.smoke
        self.code = code_version(script, root)
        self.cache = RunCache(cache_dir / f"{name}.jsonl")
        if fresh:
            self.cache.entries.clear()
        self.provenance = provenance(self.sha, self.dirty, smoke=self.smoke)  # hardware and load at the start
        self.reused = 0
        self.t0 = time.perf_counter()
        self.job_seconds: list[float] = []  # every job's own run time, cached ones included
        self.untimed = 0

    def key(self, job: dict[str, Any]) -> str:
        return config_key({"job": relativize(job, self.root), "code": self.code})

    def run_jobs(
        self,
        jobs: Iterable[dict[str, Any]],
        fn: Callable[[dict[str, Any]], Any],
        desc: str | None = None,
        parallel: int = 1,
    ) -> list[Any]:
        """fn(job) for each job not cached yet; returns every job's result, in job order.

        parallel > 1 runs that many jobs at once in worker processes (fn must be a module-level
        function); each result is cached the moment it arrives, so a kill loses only running jobs.
        """
        from concurrent.futures import ProcessPoolExecutor, as_completed

        from tqdm import tqdm

        jobs = list(jobs)
        keys = [self.key(j) for j in jobs]
        todo = [i for i, k in enumerate(keys) if self.cache.get(k) is None]
        todo = [i for n, i in enumerate(todo) if keys[i] not in {keys[j] for j in todo[:n]}]  # duplicates run once
        self.reused += len(jobs) - len(todo)
        with tqdm(
            total=len(jobs), initial=len(jobs) - len(todo), desc=desc or self.name, unit="run", dynamic_ncols=True
        ) as bar:
            if parallel <= 1:
                for i in todo:
                    t0 = time.perf_counter()
                    res = fn(jobs[i])
                    self.cache.put(
                        keys[i], relativize(jobs[i], self.root), relativize(res, self.root), time.perf_counter() - t0
                    )
                    bar.update(1)
            else:
                with ProcessPoolExecutor(parallel) as pool:
                    futures = {pool.submit(_timed, fn, jobs[i]): i for i in todo}
                    for fut in as_completed(futures):
                        i = futures[fut]
                        res, seconds = fut.result()
                        self.cache.put(keys[i], relativize(jobs[i], self.root), relativize(res, self.root), seconds)
                        bar.update(1)
        for k in dict.fromkeys(keys):
            if k in self.cache.seconds:
                self.job_seconds.append(self.cache.seconds[k])
            else:
                self.untimed += 1
        return [self.cache.get(k) for k in keys]

    def record(self, figures: dict[str, Any]) -> dict[str, Any]:
        """The one schema's record (benchmarks/record.py) of this run's figures."""
        wall = time.perf_counter() - self.t0
        ran_jobs = bool(self.job_seconds) or self.untimed > 0
        rec = {
            "schema": SCHEMA_ID,
            "name": self.name,
            "config": self.config,
            **self.provenance,
            "code_version": self.code,
            "runs_reused_from_cache": self.reused,
            # seconds of all runs behind the figures (resumed ones included), measured on `hardware`;
            # a benchmark that runs no harness jobs computed for the whole invocation
            "compute_s": sum(self.job_seconds) if ran_jobs else wall,
            "runs_untimed": self.untimed,
            "wall_s_this_invocation": wall,
            "figures": relativize(figures, self.root),
        }
        return rec

    def write(
        self,
        figures: dict[str, Any],
        text_fn: Callable[[dict], str],
        plot_fn: Callable[[dict, Path], None] | None = None,
        results_dir: Path | None = None,
        config: dict[str, Any] | None = None,
    ) -> dict[str, Path]:
        """Write <name>.json (under runs/bench_smoke for a smoke run), then <name>.txt and <name>.png generated
        from the JSON just written. `config` replaces the config given at the start (one resolved while running)."""
        results_dir = results_dir or (SMOKE_DIR if self.smoke else RESULTS)
        if config is not None:
            self.config = relativize(config, self.root)
        text = json.dumps(self.record(figures), indent=2, default=_json_default, allow_nan=True)
        results_dir.mkdir(parents=True, exist_ok=True)
        out = results_dir / f"{self.name}.json"
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(text)
        os.replace(tmp, out)
        paths = render(out, text_fn, plot_fn)
        print("wrote " + ", ".join(relpath(p, self.root) for p in paths.values()))
        errors = validate_record(json.loads(text))
        if errors:  # a harness bug (the record is built here); raised after writing, so no run is lost
            raise ValueError(f"{self.name}: record breaks the schema: {errors}")
        return paths


def _timed(fn: Callable[[dict[str, Any]], Any], job: dict[str, Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    return fn(job), time.perf_counter() - t0


def render(
    json_path: Path, text_fn: Callable[[dict], str], plot_fn: Callable[[dict, Path], None] | None = None
) -> dict[str, Path]:
    """(Re)generate the TXT and PNG beside a result JSON from its content alone."""
    record = json.loads(Path(json_path).read_text())
    paths = {"json": Path(json_path)}
    txt = Path(json_path).with_suffix(".txt")
    txt.write_text(text_fn(record).rstrip() + "\n")
    paths["txt"] = txt
    if plot_fn is not None:
        import matplotlib

        matplotlib.use("Agg")
        png = Path(json_path).with_suffix(".png")
        plot_fn(record, png)
        paths["png"] = png
    return paths


def reanalyse(
    json_path: Path,
    figures_fn: Callable[[dict], dict[str, Any]],
    text_fn: Callable[[dict], str],
    plot_fn: Callable[[dict, Path], None] | None = None,
    allow_dirty: bool = False,
) -> dict[str, Path]:
    """Recompute a result's figures from its own per-run data (`figures_fn(record)`), running nothing: the runs'
    provenance (git_sha, hardware, compute) stays, `analysis_git_sha` names the code that computed the figures."""
    rec = load_record(json_path)  # an older layout comes back in the one schema
    rec["figures"] = figures_fn(rec)
    sha, dirty = clean_sha(allow_dirty)
    rec["analysis_git_sha"] = sha + ("-dirty" if dirty else "")
    rec["not_for_commit"] = bool(rec.get("not_for_commit")) or dirty
    tmp = Path(json_path).with_suffix(".json.tmp")
    tmp.write_text(json.dumps(rec, indent=2, default=_json_default, allow_nan=True))
    os.replace(tmp, json_path)
    return render(json_path, text_fn, plot_fn)


def header(record: dict) -> str:
    """The provenance lines every TXT starts with."""
    hw = record.get("hardware", {})
    load = hw.get("load_avg_at_start")
    lines = [
        f"{record['name']} @ {record['git_sha'][:12]}"
        + ("  (NOT FOR COMMIT: dirty tree)" if record.get("not_for_commit") else ""),
        f"hardware: {hw.get('cpu')}, {hw.get('cpu_count')} cores"
        + (f", load avg at start {load[0]:.1f}" if load else "")
        + (
            "  (runtimes measured on a shared, loaded machine)" if load and load[0] > (hw.get("cpu_count") or 1) else ""
        ),
        f"runs reused from cache: {record.get('runs_reused_from_cache', 0)}; compute "
        f"{(record.get('compute_s') or 0) / 60:.1f} min"
        + (f" ({record['runs_untimed']} runs untimed)" if record.get("runs_untimed") else ""),
    ]
    return "\n".join(lines)


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return relpath(o)
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)


# -- the one command line ---------------------------------------------------------------
def bench_parser(
    doc: str | None,
    *,
    seeds: int | None = 3,
    smoke: dict[str, Any] | None = None,
    config_cls=None,
    seed_lists: bool = False,
) -> argparse.ArgumentParser:
    """The one command line of every benchmark: `--seeds N` (seeds 0..N-1; omitted where a benchmark has no
    seeds), `--smoke`, `--fresh`, `--allow-dirty`, one `--flag` per field of `config_cls` if given; each script
    adds its own flags on top. `smoke` holds the flag defaults a smoke run uses (flags given still win);
    `seed_lists` also takes an explicit `--seeds 0,2,5` (read it with `seed_list`)."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if config_cls is not None:
        from dataclasses import asdict

        for f, v in asdict(config_cls()).items():
            ap.add_argument(f"--{f.replace('_', '-')}", type=type(v), default=v)
    if seeds is not None:
        ap.add_argument(
            "--seeds",
            type=_seeds_value if seed_lists else _seed_count,
            default=seeds,
            help="number of seeds (0..S-1) per reported setting" + (", or a list 0,2,5" if seed_lists else ""),
        )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="a quick check of the whole path; writes under runs/bench_smoke, never benchmarks/results"
        + ("" if smoke else " (this benchmark has no reduced config: it runs the full protocol)"),
    )
    ap.add_argument(
        "--allow-dirty", action="store_true", help="run on a dirty tree; the result is marked not_for_commit"
    )
    ap.add_argument("--fresh", action="store_true", help="ignore this benchmark's run cache")
    ap.set_defaults(_smoke_defaults=smoke or {})
    return ap


def parse(ap: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """`ap`'s arguments; with --smoke, the smoke defaults apply (flags given explicitly still win)."""
    args = ap.parse_args(argv)
    if args.smoke:
        smoke = args._smoke_defaults
        plain = {k: ap.get_default(k) for k in smoke}
        ap.set_defaults(**smoke)
        args = ap.parse_args(argv)
        ap.set_defaults(**plain)  # the parser itself is left as it was
    del args._smoke_defaults
    return args


def own_flags(args: argparse.Namespace) -> dict[str, Any]:
    """A script's flags as its config: the harness's own (--smoke, --allow-dirty, --fresh) are not the benchmark's."""
    return {k: v for k, v in vars(args).items() if k not in ("smoke", "allow_dirty", "fresh")}


def _seed_count(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{n}: at least one seed")
    return n


def _seeds_value(text: str) -> int | list[int]:
    """N (seeds 0..N-1) or an explicit list `0,2,5` (one seed alone: `5,`)."""
    return [int(x) for x in text.split(",") if x.strip()] if "," in text else _seed_count(text)


def seed_list(seeds: int | list[int]) -> list[int]:
    """`--seeds` as the seeds themselves: N is 0..N-1, a list is itself."""
    return list(range(seeds)) if isinstance(seeds, int) else list(seeds)


def config_parser(config_cls, doc: str | None, smoke: dict[str, Any] | None = None) -> argparse.ArgumentParser:
    """`bench_parser` with one `--flag` per field of the benchmark's dataclass config."""
    return bench_parser(doc, config_cls=config_cls, smoke=smoke)


def parse_config(ap, config_cls, *extras: str) -> tuple:
    """(config, seeds, allow_dirty, fresh, *extras) from `config_parser`'s parser (extras: other flags' dests)."""
    args = vars(parse(ap))
    rest = [args.pop(k) for k in ("seeds", "allow_dirty", "fresh", *extras)]
    args.pop("smoke", None)  # a script that reads it names it in extras
    return (config_cls(**args), *rest)


# -- shared tails -----------------------------------------------------------------------
def save_figure(fig, png: Path, dpi: int = 120) -> None:
    """The plotting tail: save a benchmark's figure beside its JSON and free it."""
    import matplotlib.pyplot as plt

    fig.savefig(png, dpi=dpi)
    plt.close(fig)


def read_live_jsonl(path: Path) -> list[dict]:
    """Rows of a JSONL file another process may still be writing: no file is no rows, and a
    half-written last line is skipped (core.metrics.read_jsonl is for finished files)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def load_record(path: Path) -> dict[str, Any]:
    """A result JSON in the one schema (an older layout is upgraded as it is read)."""
    return upgrade_record(json.loads(Path(path).read_text()))


def upgrade_files(paths: Iterable[Path]) -> list[str]:
    """Rewrite each result JSON in the one schema (in place; a file already in it is left byte for byte);
    returns the problems of records that still do not validate."""
    problems = []
    for p in map(Path, paths):
        text = p.read_text()
        rec = upgrade_record(json.loads(text))
        out = json.dumps(rec, indent=2, allow_nan=True) + ("\n" if text.endswith("\n") else "")
        if out != text and json.loads(text) != rec:
            tmp = p.with_suffix(".json.tmp")
            tmp.write_text(out)
            os.replace(tmp, p)
            print(f"upgraded {p}")
        problems += [f"{p}: {e}" for e in validate_record(rec)]
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The benchmark harness's own commands.")
    ap.add_argument("--upgrade", nargs="+", metavar="JSON", help="rewrite result JSONs in the one schema (idempotent)")
    ap.add_argument("--validate", nargs="+", metavar="JSON", help="check result JSONs against the one schema")
    args = ap.parse_args(argv)
    problems = upgrade_files(args.upgrade) if args.upgrade else []
    for p in args.validate or ():
        problems += [f"{p}: {e}" for e in validate_record(json.loads(Path(p).read_text()))]
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
