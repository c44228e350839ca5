"""Golden fixtures: a run's numbers written once (`WRITE_FIXTURES=1`) and checked by every later run.

A record holds the per-step losses, a checksum of the final parameters (sha256 of their bytes in
name order) and their float64 sum, and the stack that wrote it (torch version, CPU capability).
On the stack that wrote it the check is bit-exact; on another one (other kernels, other float
rounding) the losses and the sum must agree to `rtol`, and the sha256 is not compared.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

WRITE_ENV = "WRITE_FIXTURES"


def write_fixtures() -> bool:
    """True when this run (re)writes the golden fixtures instead of checking them."""
    return os.environ.get(WRITE_ENV) == "1"


def stack() -> dict[str, str]:
    return {"torch": torch.__version__.split("+")[0], "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def weights_record(weights: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    digest = hashlib.sha256()
    total = 0.0
    for name in sorted(weights):
        t = weights[name].detach().cpu().contiguous()
        digest.update(name.encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        total += float(t.double().sum())
    return {"sha256": digest.hexdigest(), "sum": total}


def trajectory(losses: Sequence[float], weights: Mapping[str, torch.Tensor], **extra: Any) -> dict[str, Any]:
    """The record of one run: what `check_fixture` compares."""
    return {"losses": [float(x) for x in losses], "weights": weights_record(weights), **extra, "stack": stack()}


def check_fixture(path: Path, got: dict[str, Any], rtol: float = 1e-4, command: str = "") -> None:
    """With WRITE_FIXTURES=1 write `got` to `path`; else assert it matches what `path` holds."""
    path = Path(path)
    if write_fixtures():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        return
    how = f"regenerate after an intended change: {command or f'WRITE_FIXTURES=1 python -m pytest {path.parent}'}"
    assert path.exists(), f"no golden fixture {path}; {how}"
    want = json.loads(path.read_text())
    same_stack = want.get("stack") == got["stack"]
    for key in sorted(set(want) - {"losses", "weights", "stack"}):
        assert got.get(key) == want[key], f"{path.name}: {key} {got.get(key)!r} != golden {want[key]!r}; {how}"
    assert len(got["losses"]) == len(want["losses"]), (
        f"{path.name}: {len(got['losses'])} losses, golden {len(want['losses'])}; {how}"
    )
    if same_stack:
        assert got["losses"] == want["losses"], _diff(path, got["losses"], want["losses"], how)
        assert got["weights"] == want["weights"], (
            f"{path.name}: final weights {got['weights']} != golden {want['weights']}; {how}"
        )
    else:  # other kernels: the same trajectory up to float rounding
        close = torch.allclose(
            torch.tensor(got["losses"], dtype=torch.float64),
            torch.tensor(want["losses"], dtype=torch.float64),
            rtol=rtol,
            atol=0,
        )
        assert close, _diff(path, got["losses"], want["losses"], how)
        a, b = got["weights"]["sum"], want["weights"]["sum"]
        assert abs(a - b) <= rtol * max(abs(b), 1.0), f"{path.name}: parameter sum {a!r} != golden {b!r}; {how}"


def _diff(path: Path, got: Sequence[float], want: Sequence[float], how: str) -> str:
    first = next(i for i, (a, b) in enumerate(zip(got, want)) if a != b) if list(got) != list(want) else None
    return f"{path.name}: losses differ from step index {first}: got {list(got)}, golden {list(want)}; {how}"
