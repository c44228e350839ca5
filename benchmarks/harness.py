"""The harness every reproduction benchmark shares.

It runs each (config, seed) job once, checkpoints its result to a cache so an interrupted
benchmark resumes where it stopped, reports mean ± std over seeds, and writes the JSON and
then the TXT and PNG *generated from that JSON* in the same run, so they cannot disagree.

The record carries the resolved config, a clean git SHA (a dirty tree is refused unless
`allow_dirty`, and the result is then marked `not_for_commit`), versions, hardware and the
load the runtimes were measured under. Paths are stored relative to the repository.

A cache entry is keyed by the job's config and the git tree hashes of the code it runs
(decentrain/, recipes/, conf/ and the benchmark script), so a resumed run never reuses a
result that older code produced, and unrelated commits (README, results) don't invalidate it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import statistics
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.results_io import RESULTS

ROOT = RESULTS.parent.parent
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
def _git(*args: str, root: Path = ROOT) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=root, check=True).stdout.strip()


def git_state(root: Path = ROOT) -> tuple[str, bool]:
    """(HEAD sha, dirty?) where result files under benchmarks/results don't count as dirty."""
    sha = _git("rev-parse", "HEAD", root=root)
    status = _git("status", "--porcelain", "--", ".", ":!benchmarks/results", root=root)
    return sha, bool(status)


class DirtyTreeError(RuntimeError):
    pass


def clean_sha(allow_dirty: bool = False, root: Path = ROOT) -> tuple[str, bool]:
    """(sha, not_for_commit). Refuses a dirty tree unless allow_dirty, which marks the result."""
    sha, dirty = git_state(root)
    if dirty and not allow_dirty:
        raise DirtyTreeError("the working tree has uncommitted changes: commit them first (or pass --allow-dirty: "
                             "the result is then marked not_for_commit)")
    return sha, dirty


def code_version(script: str | Path, root: Path = ROOT) -> str:
    """Hash of the git trees/blobs the benchmark runs (HEAD's); with a dirty tree, of the files' contents too."""
    parts = []
    for p in (*CODE_PATHS, relpath(script, root)):
        try:
            parts.append(_git("rev-parse", f"HEAD:{p}", root=root))
        except subprocess.CalledProcessError:
            parts.append("missing:" + p)
    diff = _git("diff", "HEAD", "--", *CODE_PATHS, str(relpath(script, root)), root=root)
    if diff:  # uncommitted code must not share a cache key with HEAD's (other dirty files don't matter)
        parts.append(diff)
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def hardware() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    out: dict[str, Any] = {"cpu": cpu, "cpu_count": os.cpu_count(), "platform": platform.platform()}
    try:
        out["load_avg_at_start"] = list(os.getloadavg())
    except OSError:
        pass
    try:
        import torch

        out["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        out["cuda"] = None
    return out


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in ("torch", "transformers", "numpy"):
        try:
            out[mod] = __import__(mod).__version__
        except ImportError:
            pass
    return out


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

    def __init__(self, name: str, script: str | Path, config: dict[str, Any], *, allow_dirty: bool = False,
                 cache_dir: Path = CACHE_DIR, root: Path = ROOT, fresh: bool = False):
        self.name, self.root = name, root
        self.config = relativize(config, root)
        self.sha, self.not_for_commit = clean_sha(allow_dirty, root)
        self.code = code_version(script, root)
        self.cache = RunCache(cache_dir / f"{name}.jsonl")
        if fresh:
            self.cache.entries.clear()
        self.started = hardware()
        self.reused = 0
        self.t0 = time.perf_counter()
        self.job_seconds: list[float] = []  # every job's own run time, cached ones included
        self.untimed = 0

    def key(self, job: dict[str, Any]) -> str:
        return config_key({"job": relativize(job, self.root), "code": self.code})

    def run_jobs(self, jobs: Iterable[dict[str, Any]], fn: Callable[[dict[str, Any]], Any], desc: str | None = None,
                 parallel: int = 1) -> list[Any]:
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
        with tqdm(total=len(jobs), initial=len(jobs) - len(todo), desc=desc or self.name, unit="run", dynamic_ncols=True) as bar:
            if parallel <= 1:
                for i in todo:
                    t0 = time.perf_counter()
                    res = fn(jobs[i])
                    self.cache.put(keys[i], relativize(jobs[i], self.root), relativize(res, self.root), time.perf_counter() - t0)
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
        return {
            "name": self.name,
            "config": self.config,
            "git_sha": self.sha,
            "not_for_commit": self.not_for_commit,
            "code_version": self.code,
            "versions": versions(),
            "hardware": self.started,
            "runs_reused_from_cache": self.reused,
            # seconds of all runs behind the figures (resumed ones included), measured on `hardware`
            "compute_s": sum(self.job_seconds), "runs_untimed": self.untimed,
            "wall_s_this_invocation": time.perf_counter() - self.t0,
            "figures": relativize(figures, self.root),
        }

    def write(self, figures: dict[str, Any], text_fn: Callable[[dict], str], plot_fn: Callable[[dict, Path], None] | None = None,
              results_dir: Path = RESULTS) -> dict[str, Path]:
        """Write <name>.json, then <name>.txt and <name>.png generated from the JSON just written."""
        results_dir.mkdir(parents=True, exist_ok=True)
        out = results_dir / f"{self.name}.json"
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.record(figures), indent=2, default=_json_default, allow_nan=True))
        os.replace(tmp, out)
        return render(out, text_fn, plot_fn)


def _timed(fn: Callable[[dict[str, Any]], Any], job: dict[str, Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    return fn(job), time.perf_counter() - t0


def render(json_path: Path, text_fn: Callable[[dict], str], plot_fn: Callable[[dict, Path], None] | None = None) -> dict[str, Path]:
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


def reanalyse(json_path: Path, figures_fn: Callable[[dict], dict[str, Any]], text_fn: Callable[[dict], str],
              plot_fn: Callable[[dict, Path], None] | None = None, allow_dirty: bool = False) -> dict[str, Path]:
    """Recompute a result's figures from its own per-run data (`figures_fn(record)`), running nothing: the runs'
    provenance (git_sha, hardware, compute) stays, `analysis_git_sha` names the code that computed the figures."""
    rec = json.loads(Path(json_path).read_text())
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
    lines = [f"{record['name']} @ {record['git_sha'][:12]}" + ("  (NOT FOR COMMIT: dirty tree)" if record.get("not_for_commit") else ""),
             f"hardware: {hw.get('cpu')}, {hw.get('cpu_count')} cores" + (f", load avg at start {load[0]:.1f}" if load else "")
             + ("  (runtimes measured on a shared, loaded machine)" if load and load[0] > (hw.get("cpu_count") or 1) else ""),
             f"runs reused from cache: {record.get('runs_reused_from_cache', 0)}; compute {record.get('compute_s', 0) / 60:.1f} min"
             + (f" ({record['runs_untimed']} runs untimed)" if record.get("runs_untimed") else "")]
    return "\n".join(lines)


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return relpath(o)
    if isinstance(o, float) and math.isnan(o):
        return None
    return str(o)


def config_parser(config_cls, doc: str | None):
    """An argument parser with one `--flag` per field of the benchmark's dataclass config, plus `seeds_arg`."""
    import argparse
    from dataclasses import asdict

    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f, v in asdict(config_cls()).items():
        ap.add_argument(f"--{f.replace('_', '-')}", type=type(v), default=v)
    seeds_arg(ap)
    return ap


def parse_config(ap, config_cls, *extras: str) -> tuple:
    """(config, seeds, allow_dirty, fresh, *extras) from `config_parser`'s parser (extras: other flags' dests)."""
    args = vars(ap.parse_args())
    rest = [args.pop(k) for k in ("seeds", "allow_dirty", "fresh", *extras)]
    return (config_cls(**args), *rest)


def seeds_arg(ap, default: int = 3) -> None:
    ap.add_argument("--seeds", type=int, default=default, help="number of seeds (0..S-1) per reported setting")
    ap.add_argument("--allow-dirty", action="store_true", help="run on a dirty tree; the result is marked not_for_commit")
    ap.add_argument("--fresh", action="store_true", help="ignore this benchmark's run cache")
