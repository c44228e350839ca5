"""The one result record every benchmark writes: its schema, its provenance, and the upgrade of older layouts.

A record is one JSON object (`benchmarks/results/<name>.json`); the TXT and PNG beside it are generated
from it. Its keys (`SCHEMA`; `validate_record` checks a dict against it and returns every problem):

    schema                   "decentrain.bench/1"
    name                     the results file's stem
    config                   the resolved benchmark config (paths repo-relative)
    figures                  the benchmark's own figures (free-form; baselines name the headline ones)
    git_sha                  HEAD's 40-hex SHA, never suffixed ("unknown" outside a git checkout)
    dirty                    the tree had uncommitted changes outside benchmarks/results (untracked files count)
    not_for_commit           dirty, or a smoke run: such a result must not be committed
    command                  the command line that produced it (null: recorded before commands were kept)
    versions                 {"python": ..., "torch": ..., ...}
    hardware                 {"cpu", "cpu_count", "platform", "cuda", "load_avg_at_start" ([1, 5, 15 min] or null)}
    code_version             hash of the code trees the runs ran (null: not recorded)
    runs_reused_from_cache   runs taken from the harness cache instead of run again
    runs_untimed             cached runs whose run time was not recorded
    compute_s                seconds of all runs behind the figures, on `hardware` (null: not recorded)
    wall_s_this_invocation   seconds of the invocation that wrote the record (null: not recorded)
    analysis_git_sha         optional: the code that recomputed the figures from the runs' own data

Two layouts predate it: the harness's (the same keys without `schema`, `dirty`, `command`) and
`results_io`'s (`{name, config, environment: {git_sha[-dirty], python, torch, ...}, figures}`).
`upgrade_record` maps both onto this one, leaving `config` and `figures` untouched; it is idempotent.
jsonschema is not installed, and the check is twenty lines, so it is written here by hand.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

SCHEMA_ID = "decentrain.bench/1"
RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parent.parent

_NUM = (int, float)
_OPT_NUM = (int, float, type(None))
_OPT_STR = (str, type(None))
# key -> allowed types; every key is required unless listed in OPTIONAL
SCHEMA: dict[str, tuple[type, ...]] = {
    "schema": (str,),
    "name": (str,),
    "config": (dict,),
    "figures": (dict,),
    "git_sha": (str,),
    "dirty": (bool,),
    "not_for_commit": (bool,),
    "command": _OPT_STR,
    "versions": (dict,),
    "hardware": (dict,),
    "code_version": _OPT_STR,
    "runs_reused_from_cache": (int,),
    "runs_untimed": (int,),
    "compute_s": _OPT_NUM,
    "wall_s_this_invocation": _OPT_NUM,
    "analysis_git_sha": (str,),
}
OPTIONAL = {"analysis_git_sha"}
HARDWARE: dict[str, tuple[type, ...]] = {
    "cpu": (str,),
    "cpu_count": (int, type(None)),
    "platform": (str,),
    "cuda": _OPT_STR,
    "load_avg_at_start": (list, type(None)),
}


def _type_error(where: str, value: Any, types: tuple[type, ...]) -> str | None:
    if isinstance(value, bool) and bool not in types:  # bool is an int to isinstance; not to the schema
        return f"{where}: expected {'/'.join(t.__name__ for t in types)}, got bool"
    if not isinstance(value, types):
        return f"{where}: expected {'/'.join(t.__name__ for t in types)}, got {type(value).__name__}"
    return None


def validate_record(rec: Any) -> list[str]:
    """Every way `rec` departs from the one schema (an empty list: it conforms)."""
    if not isinstance(rec, dict):
        return [f"record: expected dict, got {type(rec).__name__}"]
    errors = [f"{k}: missing" for k in SCHEMA if k not in rec and k not in OPTIONAL]
    errors += [f"{k}: unknown key" for k in rec if k not in SCHEMA]
    errors += [e for k, t in SCHEMA.items() if k in rec for e in [_type_error(k, rec[k], t)] if e]
    if rec.get("schema") not in (None, SCHEMA_ID) and isinstance(rec.get("schema"), str):
        errors.append(f"schema: expected {SCHEMA_ID!r}, got {rec['schema']!r}")
    sha = rec.get("git_sha")
    if isinstance(sha, str) and sha != "unknown" and (len(sha) != 40 or any(c not in "0123456789abcdef" for c in sha)):
        errors.append(f"git_sha: expected 40 lowercase hex digits, got {sha!r}")
    if rec.get("dirty") is True and rec.get("not_for_commit") is False:
        errors.append("not_for_commit: a dirty tree's result must be marked not_for_commit")
    if isinstance(rec.get("versions"), dict) and not isinstance(rec["versions"].get("python"), str):
        errors.append("versions.python: missing")
    if isinstance(rec.get("hardware"), dict):
        hw = rec["hardware"]
        errors += [f"hardware.{k}: missing" for k in HARDWARE if k not in hw]
        errors += [e for k, t in HARDWARE.items() if k in hw for e in [_type_error(f"hardware.{k}", hw[k], t)] if e]
        load = hw.get("load_avg_at_start")
        if isinstance(load, list) and (len(load) != 3 or not all(isinstance(x, _NUM) for x in load)):
            errors.append("hardware.load_avg_at_start: expected 3 numbers")
    for k in ("runs_reused_from_cache", "runs_untimed", "compute_s", "wall_s_this_invocation"):
        if isinstance(rec.get(k), _NUM) and not isinstance(rec.get(k), bool) and rec[k] < 0:
            errors.append(f"{k}: negative")
    return errors


# -- provenance -------------------------------------------------------------------------
def _git(*args: str, root: Path = ROOT) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, cwd=root, check=True).stdout.strip()


def git_state(root: Path = ROOT) -> tuple[str, bool]:
    """(HEAD sha, dirty?): any change outside benchmarks/results, untracked files included, is dirty
    (an untracked module can change what a benchmark imports); result files never are."""
    try:
        sha = _git("rev-parse", "HEAD", root=root)
        status = _git("status", "--porcelain", "--", ".", ":!benchmarks/results", root=root)
    except (OSError, subprocess.CalledProcessError):  # no git, or a checkout git won't read (another owner, under sudo)
        return "unknown", True  # nothing proves the tree clean
    return sha, bool(status)


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
        out["load_avg_at_start"] = None
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


def command_line(argv: list[str] | None = None) -> str:
    """The command as a user would retype it: `python -m benchmarks.<script> <args>`."""
    argv = list(sys.argv if argv is None else argv)
    head = Path(argv[0]) if argv else Path("?")
    mod = f"benchmarks.{head.stem}" if head.parent.name == "benchmarks" else None
    return shlex.join(["python", "-m", mod, *argv[1:]] if mod else ["python", *argv])


def provenance(sha: str, dirty: bool, *, smoke: bool = False) -> dict[str, Any]:
    """The provenance keys of a record, for a run at `sha` on a tree that was `dirty` or not."""
    return {
        "git_sha": sha,
        "dirty": dirty,
        "not_for_commit": dirty or smoke,
        "command": command_line(),
        "versions": versions(),
        "hardware": hardware(),
    }


# -- older layouts ----------------------------------------------------------------------
def upgrade_record(old: dict[str, Any]) -> dict[str, Any]:
    """`old` (the harness's or results_io's layout, or this one) in the one schema; config and figures untouched.

    Keys keep their order (a small diff against the committed file): `schema` goes first, `environment`'s
    contents take its place, and other missing keys go just before `figures`. Idempotent."""
    env = old.get("environment")
    from_env: dict[str, Any] = {}
    # results_io: {git_sha[-dirty], python, torch, transformers, platform, cpu, cpu_count, cuda}
    if isinstance(env, dict):
        sha = str(env.get("git_sha", "unknown"))
        dirty = sha.endswith("-dirty")
        from_env = {
            "git_sha": sha.removesuffix("-dirty"),
            "dirty": dirty,
            "not_for_commit": dirty,
            "versions": {k: env[k] for k in ("python", "torch", "transformers", "numpy") if k in env},
            "hardware": {
                "cpu": env.get("cpu", "unknown"),
                "cpu_count": env.get("cpu_count"),
                "platform": env.get("platform", "unknown"),
                "cuda": env.get("cuda"),
                "load_avg_at_start": None,
            },
        }
    dirty = bool(old.get("dirty", from_env.get("dirty", old.get("not_for_commit", False))))
    missing = {
        "git_sha": "unknown",
        "dirty": dirty,
        "not_for_commit": dirty,
        "command": None,
        "versions": {},
        "hardware": {},
        "code_version": None,
        "runs_reused_from_cache": 0,
        "runs_untimed": 0,
        "compute_s": None,
        "wall_s_this_invocation": None,
    }
    rec: dict[str, Any] = {"schema": SCHEMA_ID}

    def fill() -> None:
        for k, v in {**missing, **from_env}.items():
            rec.setdefault(k, old.get(k, v))

    for k, v in old.items():
        if k == "environment":
            fill()
        elif k == "figures":
            fill()
            rec[k] = v
        elif k != "schema":
            rec[k] = v
    fill()
    rec["hardware"] = {**rec["hardware"], **{k: rec["hardware"].get(k) for k in HARDWARE}}
    return rec


# -- baselines --------------------------------------------------------------------------
BASELINES = RESULTS.parent / "baselines"
_BETTER = ("higher", "lower", "either")


def figure_at(rec: dict[str, Any], path: list[Any]) -> Any:
    """The value at `path` (keys and list indices) inside a record; KeyError/IndexError/TypeError if absent."""
    value: Any = rec
    for step in path:
        value = value[step]
    return value


def check_baseline(rec: dict[str, Any], baseline: dict[str, Any]) -> list[str]:
    """Every headline figure of `rec` that has left its baseline's tolerance, in the worse direction.

    A baseline (`benchmarks/baselines/<name>.json`) is `{"result": name, "figures": [{"path": [...], "value": v,
    "tolerance": t, "better": "higher"|"lower"|"either", "why": "..."}]}`: with "higher" the figure fails below
    v - t, with "lower" above v + t, with "either" beyond |v - t|. Booleans count as 0/1 (a target met is 1), so
    a target that was met and no longer is fails; one that becomes met passes (then raise the baseline)."""
    problems = []
    for fig in baseline.get("figures", []):
        where = "/".join(map(str, fig["path"]))
        try:
            got = figure_at(rec, fig["path"])
        except (KeyError, IndexError, TypeError):
            problems.append(f"{where}: missing from the result")
            continue
        want, tol, better = fig["value"], float(fig["tolerance"]), fig.get("better", "either")
        if not isinstance(got, (int, float)) or got != got:  # None or NaN where the baseline has a number
            problems.append(f"{where}: {got!r}, baseline {want!r}")
            continue
        low = float(want) - tol if better in ("higher", "either") else float("-inf")
        high = float(want) + tol if better in ("lower", "either") else float("inf")
        if not low <= float(got) <= high:
            problems.append(
                f"{where}: {got!r} outside baseline {want!r} ± {tol:g} ({better} is better): {fig.get('why', '')}"
            )
    return problems


def validate_baseline(baseline: Any) -> list[str]:
    """The ways a baseline file is malformed (each figure needs path, a numeric value, tolerance >= 0, better, why)."""
    if not isinstance(baseline, dict) or not isinstance(baseline.get("result"), str) or not baseline.get("figures"):
        return ["baseline: needs a result name and a non-empty figures list"]
    errors = []
    for i, fig in enumerate(baseline["figures"]):
        if not isinstance(fig.get("path"), list) or not fig["path"] or fig["path"][0] != "figures":
            errors.append(f"figures[{i}].path: a list starting with 'figures'")
        if (
            not isinstance(fig.get("value"), (int, float))
            or not isinstance(fig.get("tolerance"), (int, float))
            or fig["tolerance"] < 0
        ):
            errors.append(f"figures[{i}]: numeric value and tolerance >= 0")
        if fig.get("better") not in _BETTER:
            errors.append(f"figures[{i}].better: one of {_BETTER}")
        if not fig.get("why"):
            errors.append(f"figures[{i}].why: say why this figure and this tolerance")
    return errors
