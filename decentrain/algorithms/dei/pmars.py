"""Core War battles in pMARS, the reference simulator, in a subprocess with CPU, memory and time limits.

pMARS only ever reads `Warrior.render()` output (see `redcode.py`), written by this node into a
private temporary directory. Debian's `pmars` package is built for an X display and refuses to
start without one, so decentrain runs the display-less "server" build of the same source
(`launch/install_pmars.sh` builds it from Debian's source package); `PMarsConfig.binary`, the
`DECENTRAIN_PMARS` environment variable or `pmars` on PATH name it.

A battle of N warriors over R rounds returns, per warrior, how many rounds it ended with k
survivors (k = 1..N) and how many it lost: pMARS's own `Results:` line.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import resource
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from decentrain.algorithms.dei.redcode import Warrior

log = logging.getLogger(__name__)

_SCORES = re.compile(r"^(?P<name>w\d+) by .* scores (?P<score>-?\d+)\s*$", re.ASCII)
_RESULTS = re.compile(r"^\s*Results:((?:\s+\d+)+)\s*$", re.ASCII)


@dataclass
class PMarsConfig:
    binary: str | None = None  # None: $DECENTRAIN_PMARS, then `pmars` on PATH (the display-less build)
    core_size: int = 8000
    cycles: int = 80_000
    max_processes: int = 8000
    max_length: int = 100
    min_distance: int = 100
    rounds: int = 20
    timeout_s: float = 60.0  # wall clock of one pMARS run
    cpu_s: int = 30  # RLIMIT_CPU of the pMARS process
    memory_mb: int = 256  # RLIMIT_AS of the pMARS process

    def __post_init__(self) -> None:
        for name in ("core_size", "cycles", "max_processes", "max_length", "min_distance", "rounds", "cpu_s",
                     "memory_mb"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"pmars.{name}={getattr(self, name)!r} must be an integer >= 1")
        if not 0 < self.timeout_s < float("inf"):
            raise ValueError(f"pmars.timeout_s={self.timeout_s} must be finite and > 0")
        if self.min_distance > self.core_size // 2:
            raise ValueError(f"pmars.min_distance={self.min_distance} must be <= core_size / 2")


class PMarsUnavailable(RuntimeError):
    pass


def default_location() -> Path:
    """Where launch/install_pmars.sh puts the binary by default."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "decentrain" / "pmars" / "pmars"


@functools.cache
def _usable(path: str) -> str | None:
    """None if `path` runs headless, else why not (Debian's X11 build exits asking for a display)."""
    try:
        probe = subprocess.run([path, "-b", "-r", "0", "/dev/null"], capture_output=True, text=True, timeout=30,
                               stdin=subprocess.DEVNULL, errors="replace")
    except OSError as e:
        return str(e)
    except subprocess.TimeoutExpired:
        return "it did not answer in 30 s"
    return "it is built for an X display" if "X server" in probe.stdout + probe.stderr else None


def find_pmars(cfg: PMarsConfig) -> str:
    """The display-less pMARS binary, or PMarsUnavailable with the one line that says how to get it.

    Looked for in `cfg.binary`, $DECENTRAIN_PMARS, the install script's default location, then PATH.
    """
    candidates = [cfg.binary, os.environ.get("DECENTRAIN_PMARS"), str(default_location()), shutil.which("pmars")]
    for path in filter(None, candidates):
        if os.access(path, os.X_OK):
            if (why := _usable(path)) is None:
                return path
            if path in (cfg.binary, os.environ.get("DECENTRAIN_PMARS")):
                raise PMarsUnavailable(f"pmars at {path} cannot run here ({why}): run launch/install_pmars.sh")
    raise PMarsUnavailable("no display-less pMARS binary: run launch/install_pmars.sh (or set pmars.binary or "
                           "$DECENTRAIN_PMARS)")


@dataclass(frozen=True)
class BattleResult:
    """Per warrior, `placings[i][k]`: rounds warrior i ended as one of k+1 survivors; `losses[i]`."""

    placings: tuple[tuple[int, ...], ...]
    losses: tuple[int, ...]
    rounds: int

    def share(self, i: int) -> float:
        """Warrior i's end-of-round survival share, scaled like DRQ's score: N x the mean of 1/survivors.

        DRQ integrates the share over every cycle of its own simulator; pMARS reports only who is
        alive at the end of each round, so this is the share at the last cycle (a named departure).
        A warrior alone alive in every round scores N; one that dies in every round scores 0.
        """
        n = len(self.losses)
        return n * sum(c / (k + 1) for k, c in enumerate(self.placings[i])) / self.rounds


def _limits(cfg: PMarsConfig):
    def apply() -> None:  # runs in the child between fork and exec
        resource.setrlimit(resource.RLIMIT_CPU, (cfg.cpu_s, cfg.cpu_s))
        mem = cfg.memory_mb << 20
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    return apply


def parse_output(text: str, n: int, rounds: int) -> BattleResult | None:
    """pMARS's `-b` output for warriors named w0..w{n-1} -> BattleResult, or None if it is not that."""
    placings: dict[int, tuple[int, ...]] = {}
    losses: dict[int, int] = {}
    current: int | None = None
    for line in text.splitlines():
        if m := _SCORES.match(line):
            current = int(m.group("name")[1:])
            continue
        if (m := _RESULTS.match(line)) is not None:
            counts = [int(x) for x in m.group(1).split()]
            if n == 2 and len(counts) == 3 and not placings:  # two warriors: "Results: W L T" once, for w0
                w, l, t = counts
                placings = {0: (w, t), 1: (l, t)}
                losses = {0: l, 1: w}
                break
            if current is None or len(counts) != n + 1:
                return None
            placings[current], losses[current] = tuple(counts[:n]), counts[n]
    if sorted(placings) != list(range(n)):
        return None
    return BattleResult(tuple(placings[i] for i in range(n)), tuple(losses[i] for i in range(n)), rounds)


def battle(warriors: list[Warrior], cfg: PMarsConfig, seed: int) -> BattleResult | None:
    """Run one pMARS battle of `warriors` (2 to 36) for `cfg.rounds` rounds; None if it failed or timed out.

    `seed` fixes pMARS's placements (`-F`), so a battle is a function of its warriors and seed.
    """
    if not 2 <= len(warriors) <= 36:
        raise ValueError("a battle takes 2 to 36 warriors")
    binary = find_pmars(cfg)
    with tempfile.TemporaryDirectory(prefix="dei-battle-") as tmp:
        files = []
        for i, w in enumerate(warriors):
            path = Path(tmp) / f"w{i}.red"
            path.write_text(w.render(f"w{i}"))
            files.append(str(path))
        first = cfg.min_distance + seed % max(cfg.core_size - 2 * cfg.min_distance, 1)
        cmd = [binary, "-b", "-r", str(cfg.rounds), "-s", str(cfg.core_size), "-c", str(cfg.cycles),
               "-p", str(cfg.max_processes), "-l", str(cfg.max_length), "-d", str(cfg.min_distance),
               "-F", str(first), *files]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=cfg.timeout_s, cwd=tmp,
                                  preexec_fn=_limits(cfg), stdin=subprocess.DEVNULL, errors="replace")
        except subprocess.TimeoutExpired:
            log.warning("pMARS battle of %d warriors outlived %.0f s", len(warriors), cfg.timeout_s)
            return None
    result = parse_output(proc.stdout, len(warriors), cfg.rounds)
    if result is None:
        log.warning("pMARS exit %d, unreadable output: %s", proc.returncode, (proc.stderr or proc.stdout)[-200:])
    return result
