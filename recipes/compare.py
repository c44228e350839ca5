"""`decentrain compare [overrides]` (or `python -m recipes.compare`): DDP, DiLoCo, NoLoCo and
SparseLoCo at one layout, one after another, then their curves side by side.

Each arm is the ordinary pre-training recipe in its own process (`python -m recipes.train`,
which starts its workers through the same launcher as `decentrain`), writing `<run_dir>/<arm>/`,
at the layout and the arm's settings of the preset (`compare=<scale>`, conf/compare/), with a
progress line while it trains. Its console goes to `<run_dir>/<arm>.log` (for a person: nothing here parses it);
what the arm reports comes from its own files, `result.json` and `metrics.jsonl` (recipes/comparison.py). Then
`compare.png`, `compare.txt` (the table and a paragraph that reads it) and `compare.json` land in `<run_dir>`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from omegaconf import DictConfig

from decentrain.algorithms.pretraining.run import RESULT_FILE
from recipes import config_errors, recipe, run, typed_config
from recipes.comparison import CompareConfig, arm_overrides, read_arm, read_result, settings, write_summary


class MetricsTail:
    """The newest step and eval loss of a metrics.jsonl another process is writing (read from where it left off;
    a half-written last line waits for the next read)."""

    def __init__(self, path: Path):
        self.path, self.offset, self.step, self.eval_loss = path, 0, 0, None

    def poll(self) -> None:
        if not self.path.exists():
            return
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        done = data.rfind(b"\n") + 1
        self.offset += done
        for line in data[:done].splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            self.step = max(self.step, int(row.get("step", 0)))
            self.eval_loss = row.get("eval/loss", self.eval_loss)


def follow(proc: subprocess.Popen, tail: MetricsTail, name: str, steps: int, every_s: float = 2.0) -> int:
    """A progress line for one arm while it trains (its step from rank 0's metrics); the arm's exit code."""
    from tqdm import tqdm

    quiet = every_s if sys.stderr.isatty() else 30.0  # into a log file: a line every 30 s, not every poll
    with tqdm(total=steps, desc=f"[compare] {name}", unit="step", dynamic_ncols=True, mininterval=quiet) as bar:
        while True:
            try:
                code = proc.wait(timeout=every_s)  # the arm's exit is the event; the metrics file is read between
            except subprocess.TimeoutExpired:
                code = None
            tail.poll()
            bar.update(min(tail.step, steps) - bar.n)
            if tail.eval_loss is not None:
                bar.set_postfix_str(f"eval loss {tail.eval_loss:.3f}", refresh=False)
            if code is not None:
                return code


def run_arm(cfg: CompareConfig, name: str, run_dir: Path) -> None:
    log = run_dir / f"{name}.log"
    argv = [sys.executable, "-m", "recipes.train", *arm_overrides(cfg, name, run_dir / name)]
    (run_dir / name / RESULT_FILE).unlink(missing_ok=True)  # one an earlier run left here is not this arm's
    start = time.perf_counter()
    print(
        f"[compare] {name}: training ({cfg.workers} workers, {cfg.steps} steps; "
        f"settings: {settings(cfg, name).behind}); log {log}",
        flush=True,
    )
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        code = follow(proc, MetricsTail(run_dir / name / "metrics.jsonl"), name, cfg.steps)
    result = read_result(run_dir / name)
    if code != 0 or result is None:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        why = f"exit {code}" if code else f"exit 0 but no {RESULT_FILE}"
        sys.exit(f"[compare] {name} failed ({why}); the end of {log}:\n{tail}")
    print(f"[compare] {name}: {result['line']} ({time.perf_counter() - start:.0f}s with start-up)", flush=True)


def to_config(dcfg: DictConfig) -> CompareConfig:
    """The one conversion: Hydra's config to the typed dataclass (validation runs here, before start)."""
    return typed_config(dcfg, CompareConfig)


@recipe("compare", own={"compare_schema": CompareConfig})  # CompareConfig lives beside this recipe
def main(dcfg: DictConfig) -> None:
    with config_errors():  # bad config: one clear line, before any arm starts
        cfg = to_config(dcfg)
    run_dir = Path(cfg.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in cfg.algorithms:
        run_arm(cfg, name, run_dir)
    arms = [read_arm(name, run_dir / name) for name in cfg.algorithms]
    print(write_summary(arms, cfg, run_dir), flush=True)
    print(f"[compare] figure {run_dir / 'compare.png'}; table and reading {run_dir / 'compare.txt'}")


if __name__ == "__main__":
    run(main)
