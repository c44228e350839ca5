"""An HDEE ensemble plan: seed models, expert lanes, per-expert width and steps.

A seed is trained on general text. Each lane branches from one seed and trains on
its domains in order; iteration k of lane i continues from iteration k-1's
checkpoint and is saved under its own run name `lane{i}-it{k}-{size}`, so no two
runs share a checkpoint directory. Heterogeneity is per lane: the FFN width
(`intermediate_size`, depth fixed by the model config) and the steps per domain.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# Run names become directory names: keep them portable.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass
class SeedConfig:
    name: str = "seed"  # also its run name / checkpoint directory
    size: str = "M"  # label only; the width is intermediate_size
    intermediate_size: int = 3072
    steps: int = 1000
    domains: list[str] = field(default_factory=lambda: ["general"])
    tokenizer: str = "byt5"


@dataclass
class LaneConfig:
    domains: list[str] = field(default_factory=list)  # trained in this order
    steps: list[int] = field(default_factory=list)  # one entry per domain
    size: str = "M"  # label used in run names
    intermediate_size: int = 3072  # FFN width; must equal its seed's, it starts from those weights
    seed: str = "seed"  # SeedConfig.name to branch from
    tokenizer: str = "byt5"


@dataclass(frozen=True)
class ExpertRun:
    """One training job: a lane's iteration on one domain."""

    lane: int
    iteration: int
    domain: str
    steps: int
    size: str
    intermediate_size: int
    tokenizer: str
    init_from: str  # run name of the checkpoint to start from
    name: str


@dataclass
class EnsemblePlan:
    seeds: list[SeedConfig] = field(default_factory=lambda: [SeedConfig()])
    lanes: list[LaneConfig] = field(default_factory=list)
    tokens_per_step: int = 0  # global batch size x sequence length
    # Experts with different tokenizers are only comparable through a shared byte vocabulary.
    per_expert_tokenization: bool = False
    # Every expert's domain phase follows one LR schedule of this many steps and stops at its own
    # step count, so unequal-step experts are checkpoints of one schedule (the paper's 300/400/500-step
    # experts stop inside one 600-step cosine). None: each run's schedule spans its own steps.
    domain_schedule_steps: int | None = None

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Checks that need no outside knowledge; `validate` adds the domain check."""
        if self.tokens_per_step <= 0:
            raise ValueError(f"plan.tokens_per_step={self.tokens_per_step} must be > 0")
        if not self.seeds:
            raise ValueError("plan.seeds is empty; every lane branches from a seed")
        if not self.lanes:
            raise ValueError("plan.lanes is empty; an ensemble needs at least one expert lane")
        seeds: dict[str, SeedConfig] = {}
        for i, seed in enumerate(self.seeds):
            where = f"seeds[{i}] ({seed.name!r})"
            if seed.name in seeds:
                raise ValueError(f"{where}.name is used twice; seed names must be unique")
            if not _SAFE_NAME.match(seed.name):
                raise ValueError(f"{where}.name must match {_SAFE_NAME.pattern} (it names a directory)")
            if seed.steps <= 0:
                raise ValueError(f"{where}.steps={seed.steps} must be > 0")
            if seed.intermediate_size <= 0:
                raise ValueError(f"{where}.intermediate_size={seed.intermediate_size} must be > 0")
            if not seed.domains:
                raise ValueError(f"{where}.domains is empty")
            seeds[seed.name] = seed
        for i, lane in enumerate(self.lanes):
            _check_lane(i, lane, seeds)
            if self.domain_schedule_steps is not None and max(lane.steps) > self.domain_schedule_steps:
                raise ValueError(
                    f"{_lane(i)}.steps={lane.steps} runs past plan.domain_schedule_steps="
                    f"{self.domain_schedule_steps}; an expert stops inside the shared schedule"
                )
        self._check_tokenizers()
        names = [s.name for s in self.seeds] + [r.name for r in self.expert_runs()]
        clashes = sorted({n for n in names if names.count(n) > 1})
        if clashes:
            raise ValueError(f"run names {clashes} are not unique; rename the seeds")

    def _check_tokenizers(self) -> None:
        # Each lane already matches its seed, so comparing lanes covers every used seed too.
        if self.per_expert_tokenization:
            return
        first = self.lanes[0].tokenizer
        for i, lane in enumerate(self.lanes[1:], start=1):
            if lane.tokenizer != first:
                raise ValueError(
                    f"{_lane(i)}.tokenizer={lane.tokenizer!r} differs from {_lane(0)}.tokenizer={first!r}; "
                    "experts in one ensemble share a tokenizer unless plan.per_expert_tokenization=True "
                    "(mixture over a shared byte vocabulary)"
                )

    @property
    def num_experts(self) -> int:
        return len(self.lanes)

    def seed(self, name: str) -> SeedConfig:
        for seed in self.seeds:
            if seed.name == name:
                return seed
        raise ValueError(f"seed {name!r} is unknown; allowed: {[s.name for s in self.seeds]}")

    def expert_runs(self) -> list[ExpertRun]:
        """Every expert job, lane by lane; each starts from `init_from`'s checkpoint."""
        runs = []
        for i, lane in enumerate(self.lanes):
            init_from = lane.seed
            for k, (domain, steps) in enumerate(zip(lane.domains, lane.steps)):
                name = run_name(i, k, lane.size)
                runs.append(
                    ExpertRun(i, k, domain, steps, lane.size, lane.intermediate_size, lane.tokenizer, init_from, name)
                )
                init_from = name
        return runs

    def final_experts(self) -> list[str]:
        """Run names of each lane's last iteration: the experts the ensemble mixes."""
        return [run_name(i, len(lane.domains) - 1, lane.size) for i, lane in enumerate(self.lanes)]


def run_name(lane: int, iteration: int, size: str) -> str:
    """Checkpoint directory name, unique per (lane, iteration, size)."""
    return f"lane{lane}-it{iteration}-{size}"


def _lane(i: int) -> str:
    return f"lanes[{i}] (lane{i})"


def _check_lane(i: int, lane: LaneConfig, seeds: dict[str, SeedConfig]) -> None:
    where = _lane(i)
    if not lane.domains:
        raise ValueError(f"{where}.domains is empty; a lane trains on at least one domain")
    if not lane.steps:
        raise ValueError(f"{where}.steps is empty; give one step count per domain ({len(lane.domains)})")
    if len(lane.steps) != len(lane.domains):
        raise ValueError(
            f"{where}.steps has {len(lane.steps)} entries but {where}.domains has {len(lane.domains)}; "
            "give one step count per domain"
        )
    for k, (domain, steps) in enumerate(zip(lane.domains, lane.steps)):
        if steps <= 0:
            raise ValueError(f"{where}.steps[{k}]={steps} (domain {domain!r}) must be > 0")
    if lane.intermediate_size <= 0:
        raise ValueError(f"{where}.intermediate_size={lane.intermediate_size} must be > 0")
    if not _SAFE_NAME.match(lane.size):
        raise ValueError(f"{where}.size={lane.size!r} must match {_SAFE_NAME.pattern} (it names a directory)")
    if lane.seed not in seeds:
        raise ValueError(f"{where}.seed={lane.seed!r} is unknown; allowed: {sorted(seeds)}")
    seed = seeds[lane.seed]
    if seed.intermediate_size != lane.intermediate_size:
        raise ValueError(
            f"{where}.intermediate_size={lane.intermediate_size} differs from seed {seed.name!r}'s "
            f"{seed.intermediate_size}; a lane starts from its seed's weights, so widths must match"
        )
    if seed.tokenizer != lane.tokenizer:
        raise ValueError(
            f"{where}.tokenizer={lane.tokenizer!r} differs from seed {seed.name!r}'s {seed.tokenizer!r}; "
            "a lane starts from its seed's weights and vocabulary"
        )


def validate(plan: EnsemblePlan, known_domains: Iterable[str]) -> None:
    """Refuse a plan before any training: bad fields, unknown domains, mixed tokenizers."""
    plan.check()
    known = sorted(set(known_domains))
    for i, seed in enumerate(plan.seeds):
        for k, domain in enumerate(seed.domains):
            if domain not in known:
                raise ValueError(f"seeds[{i}] ({seed.name!r}).domains[{k}]={domain!r} is unknown; allowed: {known}")
    for i, lane in enumerate(plan.lanes):
        for k, domain in enumerate(lane.domains):
            if domain not in known:
                raise ValueError(f"{_lane(i)}.domains[{k}]={domain!r} is unknown; allowed: {known}")
