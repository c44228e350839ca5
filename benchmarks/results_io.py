"""What every benchmark records beside its figures: config, git SHA, versions, hardware."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any, Callable

RESULTS = Path(__file__).resolve().parent / "results"


def git_sha() -> str:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=RESULTS.parent, check=True).stdout.strip()
        # result files themselves don't make the code dirty
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results"],
                               capture_output=True, text=True, cwd=RESULTS.parent.parent).stdout.strip()
        return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def environment() -> dict[str, Any]:
    import torch
    import transformers

    return {
        "git_sha": git_sha(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


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


def write_results(name: str, config: Any, figures: dict[str, Any]) -> Path:
    """Write `benchmarks/results/<name>.json` atomically and return its path."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    record = {"name": name, "config": asdict(config) if is_dataclass(config) else config, "environment": environment(), "figures": figures}
    out = RESULTS / f"{name}.json"
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str))
    os.replace(tmp, out)
    return out


def write_json_txt_png(name: str, config: Any, figures: dict[str, Any], text: str,
                       plot: Callable[[dict[str, Any], Path], None]) -> Path:
    """The JSON, the TXT generated from it (`text`) and the PNG (`plot(figures, path)`) of one benchmark."""
    out = write_results(name, config, figures)
    (RESULTS / f"{name}.txt").write_text(text + "\n")
    plot(figures, RESULTS / f"{name}.png")
    print(f"wrote {out}, {name}.txt and {name}.png")
    return out
