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

import dataclasses
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

MAX_WARRIORS = 36  # pMARS's MAXWARRIOR: a battle of more warriors is refused by pMARS itself
# pMARS's own ranges are far wider (core up to 2^30 cells, cycles up to LONG_MAX); past these bounds
# no battle fits a run's limits, so a value beyond them is a typo, refused before any node starts.
BOUNDS = {
    "core_size": 1 << 20,
    "cycles": 10**9,
    "max_processes": 1 << 20,
    "max_length": 1000,
    "min_distance": 1 << 19,
    "rounds": 100_000,
    "cpu_s": 3600,
    "memory_mb": 1 << 20,
}

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
        for name, high in BOUNDS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
                raise ValueError(f"pmars.{name}={value!r} must be an integer in [1, {high}]")
        if not (isinstance(self.timeout_s, (int, float)) and 0 < self.timeout_s <= 3600):
            raise ValueError(f"pmars.timeout_s={self.timeout_s} must be in (0, 3600]")
        if self.binary is not None and (not isinstance(self.binary, str) or not self.binary):
            raise ValueError(f"pmars.binary={self.binary!r} must be a path or null")
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
        probe = subprocess.run(
            [path, "-b", "-r", "0", "/dev/null"],
            capture_output=True,
            text=True,
            timeout=30,
            stdin=subprocess.DEVNULL,
            errors="replace",
        )
    except OSError as e:
        return str(e)
    except subprocess.TimeoutExpired:
        return "it did not answer in 30 s"
    return "it is built for an X display" if "X server" in probe.stdout + probe.stderr else None


def find_pmars(cfg: PMarsConfig) -> str:
    """The display-less pMARS binary, or PMarsUnavailable with the one line that says how to get it.

    A binary the user named (`cfg.binary`, else $DECENTRAIN_PMARS) is the only one used: missing or
    unusable, it is an error, never a silent fallback to another pMARS on the machine. With none
    named: the install script's default location, then PATH.
    """
    env = os.environ.get("DECENTRAIN_PMARS")
    named = (f"pmars.binary={cfg.binary}", cfg.binary) if cfg.binary else (f"$DECENTRAIN_PMARS={env}", env)
    if named[1]:
        what, path = named
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise PMarsUnavailable(f"{what} is not an executable file")
        if (why := _usable(path)) is not None:
            raise PMarsUnavailable(f"{what} cannot run here ({why}): run launch/install_pmars.sh")
        return path
    for path in filter(None, [str(default_location()), shutil.which("pmars")]):
        if os.path.isfile(path) and os.access(path, os.X_OK) and _usable(path) is None:
            return path
    raise PMarsUnavailable(
        "no display-less pMARS binary: run launch/install_pmars.sh (or set pmars.binary or $DECENTRAIN_PMARS)"
    )


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
                won, lost, tied = counts
                placings = {0: (won, tied), 1: (lost, tied)}
                losses = {0: lost, 1: won}
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
    result, why = fight(warriors, cfg, seed)
    if result is None:
        log.warning("pMARS battle of %d warriors failed: %s", len(warriors), why)
    return result


def probe(warriors: list[Warrior], cfg: PMarsConfig) -> None:
    """One round of one battle of `warriors` under `cfg`'s limits, or PMarsUnavailable saying why not.

    Run once before any node starts, with as many warriors as the run's largest battle: a binary
    that is not pMARS, or limits no battle fits in, is one line then instead of every battle failing.
    """
    binary = find_pmars(cfg)
    result, why = fight(warriors, dataclasses.replace(cfg, rounds=1), seed=0)
    if result is None:
        raise PMarsUnavailable(
            f"pmars: a probe battle of {len(warriors)} warriors in {binary} failed under "
            f"pmars.memory_mb={cfg.memory_mb}, cpu_s={cfg.cpu_s}, timeout_s={cfg.timeout_s}: "
            f"{why}"
        )


def fight(warriors: list[Warrior], cfg: PMarsConfig, seed: int) -> tuple[BattleResult | None, str]:
    """`battle`'s result, or None and why not in one line (never raises for a run that failed)."""
    if not 2 <= len(warriors) <= MAX_WARRIORS:
        raise ValueError(f"a battle takes 2 to {MAX_WARRIORS} warriors")
    binary = find_pmars(cfg)
    with tempfile.TemporaryDirectory(prefix="dei-battle-") as tmp:
        files = []
        for i, w in enumerate(warriors):
            path = Path(tmp) / f"w{i}.red"
            path.write_text(w.render(f"w{i}"))
            files.append(str(path))
        first = cfg.min_distance + seed % max(cfg.core_size - 2 * cfg.min_distance, 1)
        cmd = [
            binary,
            "-b",
            "-r",
            str(cfg.rounds),
            "-s",
            str(cfg.core_size),
            "-c",
            str(cfg.cycles),
            "-p",
            str(cfg.max_processes),
            "-l",
            str(cfg.max_length),
            "-d",
            str(cfg.min_distance),
            "-F",
            str(first),
            *files,
        ]
        try:
            proc = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                timeout=cfg.timeout_s,
                cwd=tmp,
                preexec_fn=_limits(cfg),
                stdin=subprocess.DEVNULL,
                errors="replace",
            )
        except subprocess.TimeoutExpired:
            return None, f"it outlived pmars.timeout_s={cfg.timeout_s}"
        except (OSError, subprocess.SubprocessError) as e:  # could not start under these limits
            return None, f"it did not start ({type(e).__name__}: {e})"
    result = parse_output(proc.stdout, len(warriors), cfg.rounds)
    if result is None:
        tail = " ".join((proc.stderr or proc.stdout or "no output").split())[-200:]
        return None, f"exit {proc.returncode}, no results ({tail})"
    return result, ""
