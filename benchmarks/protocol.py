"""The one tuning and decision protocol every comparison benchmark uses (docs/benchmarks.md).

Decision: a `DecisionRule` is fixed before the run (`preregister` stores it in the run cache and in the
record's config; a resumed run with another rule is refused), and `decide` turns per-seed results,
paired by seed, into a verdict from the record's own numbers:

  claim "better":  "better" when the 95 % t interval of contender − baseline lies below 0, "worse" when it
                   lies above 0, else "undecided" (with the effect the run could detect at 80 % power and the
                   seeds the observed effect would need);
  claim "reaches": "reaches" by equivalence (TOST: both one-sided tests at alpha, i.e. the 90 % interval
                   inside ±margin × |baseline mean|); else "better" / "worse" / "undecided" as above.

"Lower is better" is the default (losses); a rule with `lower_is_better=False` reads rates and ratios.
A fixed target (survivors ≥ 0.9 of the no-fault rate) is a baseline of constant values: the paired test
is then the one-sample test of the contender against it.

Tuning: `grid_search` searches every outer setting of an arm on the product of its axes' start values,
then walks: while the winner has an unevaluated ladder neighbour on an ordered axis (a grid edge), that
neighbour is run (one rung beyond the edge, repeated), so the winner ends bracketed on every axis or the
record says where it is not. Every point runs on the first tuning seed; the best `finalists` run on every
tuning seed, and the winner is the best mean over all of them (a screen, documented: on 2 shared cores
the full product on 2 seeds does not fit). The runner-up is reported, and a winner or runner-up whose
tuning seeds disagree by more than `DISAGREE_FACTOR` × the grid's seed noise is flagged (a setting on the
edge of stability is bimodal across seeds). Evaluation seeds are disjoint from the tuning seeds
(`check_seeds`); `consistency` compares the tuning seeds' mean at the winner with the evaluation seeds'.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

CLAIMS = ("better", "reaches")
MIN_TUNING_SEEDS, MIN_EVAL_SEEDS = 2, 8
DISAGREE_FACTOR = 3.0  # a point's tuning-seed spread above this x the grid's median spread is flagged


# -- the decision rule ------------------------------------------------------------------
@dataclass(frozen=True)
class DecisionRule:
    claim: str  # "better" | "reaches"
    margin: float = 0.01  # relative equivalence margin for "reaches": ±margin x |baseline mean|
    alpha: float = 0.05
    power: float = 0.8
    lower_is_better: bool = True

    def __post_init__(self) -> None:
        if self.claim not in CLAIMS:
            raise ValueError(f"DecisionRule.claim={self.claim!r}: one of {CLAIMS}")
        if not 0 < self.margin < 1:
            raise ValueError(f"DecisionRule.margin={self.margin}: a relative margin in (0, 1)")
        if not 0 < self.alpha < 0.5:
            raise ValueError(f"DecisionRule.alpha={self.alpha}: in (0, 0.5)")
        if not 0 < self.power < 1:
            raise ValueError(f"DecisionRule.power={self.power}: in (0, 1)")


def _t_stats(d: Sequence[float]) -> tuple[int, float, float, float]:
    n = len(d)
    mean = statistics.fmean(d)
    sd = statistics.stdev(d) if n > 1 else 0.0
    return n, mean, sd, sd / math.sqrt(n)


def _p_greater(t: float, df: int) -> float:
    """P(T >= t); a zero-variance sample gives t = ±inf (scipy would give nan)."""
    from scipy.stats import t as student

    return float(student.sf(t, df))


def power_of(n: int, effect: float, sd: float, alpha: float = 0.05) -> float:
    """Power of a two-sided paired t-test at level alpha with n pairs, for a true mean difference `effect`
    and a std of the differences `sd` (non-central t, exact)."""
    from scipy.stats import nct
    from scipy.stats import t as student

    if n < 2 or sd <= 0:
        return math.nan
    crit = float(student.ppf(1 - alpha / 2, n - 1))
    nc = abs(effect) / (sd / math.sqrt(n))
    power = float(nct.sf(crit, n - 1, nc) + nct.cdf(-crit, n - 1, nc))
    return power if math.isfinite(power) else float(nc > crit)  # scipy's nct gives nan far in the tail


def detectable(n: int, sd: float, alpha: float = 0.05, power: float = 0.8) -> float | None:
    """The smallest true mean difference a two-sided paired t-test with n pairs finds with `power`."""
    from scipy.optimize import brentq

    if n < 2 or sd <= 0 or not math.isfinite(sd):
        return None
    hi = sd
    while power_of(n, hi, sd, alpha) < power:
        hi *= 2
    return float(brentq(lambda e: power_of(n, e, sd, alpha) - power, 0.0, hi, xtol=sd * 1e-6))


def seeds_needed(effect: float, sd: float, alpha: float = 0.05, power: float = 0.8, limit: int = 10_000) -> int | None:
    """Pairs a two-sided paired t-test needs to find a true difference `effect` with `power` (None: none up to
    limit)."""
    if sd <= 0 or not math.isfinite(sd):
        return 2
    if effect == 0:
        return None
    for n in itertools.chain(range(2, 64), range(64, limit + 1, 8)):
        if power_of(n, effect, sd, alpha) >= power:
            return n
    return None


def decide(contender: Sequence[float], baseline: Sequence[float], rule: DecisionRule) -> dict[str, Any]:
    """The verdict of `rule` on per-seed results paired by index (contender[i] and baseline[i] share seed i).

    Returns verdict, supported (the claim holds), the paired mean difference contender − baseline, its
    (1 − alpha) t interval, n, the two-sided p, the effect detectable at `rule.power`, the seeds the
    observed effect would need, and for "reaches" the equivalence bound and the TOST p."""
    from scipy.stats import t as student

    if len(contender) != len(baseline):
        raise ValueError(
            f"decide: {len(contender)} contender values against {len(baseline)} baseline values (paired by seed)"
        )
    d = [float(a) - float(b) for a, b in zip(contender, baseline)]
    out: dict[str, Any] = {
        "rule": asdict(rule),
        "n": len(d),
        "mean_diff": None,
        "std_diff": None,
        "ci": None,
        "ci_level": 1 - rule.alpha,
        "p": None,
        "detectable": None,
        "seeds_needed": None,
    }
    if not d or any(not math.isfinite(x) for x in d):
        return {**out, "verdict": "undecided", "supported": False, "why": "a missing or non-finite result"}
    n, mean, sd, se = _t_stats(d)
    out.update(
        mean_diff=mean,
        std_diff=sd,
        baseline_mean=statistics.fmean(baseline),
        contender_mean=statistics.fmean(contender),
    )
    if n < 2:
        return {**out, "verdict": "undecided", "supported": False, "why": "one seed: no interval"}
    df = n - 1
    half = float(student.ppf(1 - rule.alpha / 2, df)) * se
    out["ci"] = [mean - half, mean + half]
    t = mean / se if se > 0 else math.copysign(math.inf, mean) if mean else 0.0
    out["p"] = 1.0 if t == 0 else min(1.0, 2 * _p_greater(abs(t), df))
    out["detectable"] = detectable(n, sd, rule.alpha, rule.power)
    out["seeds_needed"] = seeds_needed(mean, sd, rule.alpha, rule.power)
    good = (lambda lo, hi: hi < 0) if rule.lower_is_better else (lambda lo, hi: lo > 0)
    bad = (lambda lo, hi: lo > 0) if rule.lower_is_better else (lambda lo, hi: hi < 0)
    lo, hi = out["ci"]
    verdict = "better" if good(lo, hi) else "worse" if bad(lo, hi) else "undecided"
    if rule.claim == "reaches":
        bound = rule.margin * abs(out["baseline_mean"])
        t_lo = (mean + bound) / se if se > 0 else (math.inf if mean > -bound else -math.inf)
        t_hi = (mean - bound) / se if se > 0 else (-math.inf if mean < bound else math.inf)
        p_tost = max(_p_greater(t_lo, df), 1 - _p_greater(t_hi, df))  # H0: d <= -bound; H0: d >= bound
        eq_half = float(student.ppf(1 - rule.alpha, df)) * se
        out.update(bound=bound, p_tost=p_tost, ci_tost=[mean - eq_half, mean + eq_half])
        # seeds for the TOST to pass at the observed mean (approximate: one-sided power against the nearer bound)
        out["seeds_needed_tost"] = (
            seeds_needed(bound - abs(mean), sd, 2 * rule.alpha, rule.power) if abs(mean) < bound else None
        )
        if p_tost < rule.alpha:
            verdict = "reaches"
    out["verdict"] = verdict
    out["supported"] = verdict == "better" or (rule.claim == "reaches" and verdict == "reaches")
    return out


def describe(result: Mapping[str, Any], digits: int = 3) -> str:
    """One line: verdict, paired mean difference, interval, p, and what an undecided run would need."""
    if result.get("ci") is None:
        return f"{result['verdict']} ({result.get('why', 'no interval')})"
    lo, hi = result["ci"]
    s = (
        f"{result['verdict']}: {result['mean_diff']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}] "
        f"(n={result['n']}, p={result['p']:.3f}"
    )
    if "bound" in result:
        s += f", TOST ±{result['bound']:.{digits}f} p={result['p_tost']:.3f}"
    s += ")"
    if result["verdict"] == "undecided":
        det = result.get("detectable")
        need = result.get("seeds_needed")
        s += f"; detectable at {result['rule']['power']:.0%} power ±{det:.{digits}f}" if det is not None else ""
        s += f"; the observed effect would need {need} seeds" if need else "; no effect observed"
    return s


def describe_rule(rule: Mapping[str, Any]) -> str:
    """A stored rule in words."""
    side = "below" if rule.get("lower_is_better", True) else "above"
    level = f"{1 - rule['alpha']:.0%}"
    if rule["claim"] == "reaches":
        return (
            f"reaches: TOST within ±{rule['margin']:.0%} of the baseline's mean (else better/worse/undecided "
            f"on the {level} CI)"
        )
    return f"better: the {level} CI of the paired difference {side} 0"


def describe_rules(rules: Mapping[str, Mapping[str, Any]]) -> str:
    """Stored rules in words, the decisions sharing a rule named together."""
    groups: dict[str, list[str]] = {}
    for name, r in rules.items():
        groups.setdefault(describe_rule(r), []).append(name)
    return "; ".join(f"{rule} ({', '.join(names)})" for rule, names in groups.items())


def check_seeds(tuning: Sequence[int], evaluation: Sequence[int]) -> list[str]:
    """What a run's seeds break of the protocol (empty: none)."""
    out = []
    if len(set(tuning)) < MIN_TUNING_SEEDS:
        out.append(f"{len(set(tuning))} tuning seed(s) < {MIN_TUNING_SEEDS}")
    if len(set(evaluation)) < MIN_EVAL_SEEDS:
        out.append(f"{len(set(evaluation))} evaluation seeds < {MIN_EVAL_SEEDS}")
    if set(tuning) & set(evaluation):
        out.append(f"tuning and evaluation seeds overlap: {sorted(set(tuning) & set(evaluation))}")
    return out


def unmet(
    tuning: Mapping[str, Mapping[str, Any]],
    tuning_seeds: Sequence[int],
    eval_seeds: Sequence[int],
    tokens_per_param: float | None,
    corpus: Mapping[str, Any] | None,
    pinned: str = "pinned",
) -> list[str]:
    """Every way a comparison's run falls short of the protocol (empty: the verdicts stand as decided)."""
    out = check_seeds(tuning_seeds, eval_seeds)
    if tokens_per_param is None or tokens_per_param < 20:
        out.append(f"{tokens_per_param or 0:.1f} tokens per parameter < 20")
    if not corpus or corpus.get("name") != pinned or not corpus.get("hash"):
        out.append(f"not the pinned corpus (ran on {(corpus or {}).get('name', 'an unnamed corpus')})")
    for arm, t in tuning.items():
        if not t.get("bracketed", False):
            out.append(f"{arm}: winner on its grid's edge ({', '.join(t.get('open_axes', []))})")
        if t.get("disagreement", {}).get("flagged"):
            out.append(f"{arm}: tuning seeds disagree")
    return out


# -- fixed before the run ---------------------------------------------------------------
def preregister(cache_dir: Path, name: str, rules: Mapping[str, DecisionRule], fresh: bool = False) -> dict[str, Any]:
    """Store the rules before any run, beside the run cache; a resumed run whose rules differ is refused
    (pass --fresh to start over). Returns them as the record stores them (config['decision_rules'])."""
    stored = {k: asdict(r) for k, r in rules.items()}
    path = Path(cache_dir) / f"{name}.rules.json"
    if path.exists() and not fresh:
        old = json.loads(path.read_text())
        if old != stored:
            raise SystemExit(
                f"{name}: the decision rules differ from those fixed when this run began ({path}); "
                "a rule is fixed before the run: pass --fresh to start a new one"
            )
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(stored, indent=1, sort_keys=True))
    return stored


def decision(
    name: str,
    contender: str,
    baseline: str,
    rule: DecisionRule | Mapping[str, Any],
    contender_values: Sequence[float],
    baseline_values: Sequence[float],
    metric: str,
) -> dict[str, Any]:
    """A decision as a record stores it: names, the per-seed values and the result `decide` gives."""
    rule = rule if isinstance(rule, DecisionRule) else DecisionRule(**rule)
    return {
        "name": name,
        "contender": contender,
        "baseline": baseline,
        "metric": metric,
        "contender_values": [float(x) for x in contender_values],
        "baseline_values": [float(x) for x in baseline_values],
        "result": decide(contender_values, baseline_values, rule),
    }


def recompute(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A stored decision's result, computed again from its own values and rule (verdicts are never typed)."""
    return decide(entry["contender_values"], entry["baseline_values"], DecisionRule(**entry["result"]["rule"]))


def decisions_in(obj: Any) -> list[dict[str, Any]]:
    """Every stored decision anywhere in a record's figures."""
    if isinstance(obj, dict):
        if {"contender_values", "baseline_values", "result"} <= set(obj):
            return [obj]
        return [d for v in obj.values() for d in decisions_in(v)]
    if isinstance(obj, list):
        return [d for v in obj for d in decisions_in(v)]
    return []


# -- tuning -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Axis:
    """One outer setting: its ladder (ordered values, or choices), and the values the grid starts from."""

    ladder: tuple
    start: tuple
    ordered: bool = True  # False: a choice (Nesterov or heavy ball) with no edge

    def __post_init__(self) -> None:
        missing = [v for v in self.start if v not in self.ladder]
        if missing or not self.start:
            raise ValueError(f"Axis start {self.start} must be non-empty values of its ladder {self.ladder}")


Point = tuple  # one value per axis, in the space's axis order


def _key(point: Point) -> str:
    return json.dumps(list(point))


@dataclass
class _Grid:
    space: dict[str, Axis]
    seeds: list[int]
    ok: Callable[[Point], bool] = lambda p: True
    values: dict[Point, dict[int, float]] = field(default_factory=dict)

    def mean(self, p: Point) -> float:
        vals = self.values.get(p, {})
        return statistics.fmean(vals.values()) if len(vals) == len(self.seeds) else math.inf

    def complete(self) -> list[Point]:
        return sorted((p for p, v in self.values.items() if len(v) == len(self.seeds)), key=self.mean)

    def neighbours(self, p: Point) -> list[Point]:
        out = []
        for i, axis in enumerate(self.space.values()):
            if not axis.ordered:
                continue
            j = axis.ladder.index(p[i])
            for k in (j - 1, j + 1):
                if 0 <= k < len(axis.ladder):
                    out.append(p[:i] + (axis.ladder[k],) + p[i + 1 :])
        return out

    def open_axes(self, p: Point) -> list[str]:
        """Axes on which `p` is not bracketed: a valid ladder neighbour that was not evaluated."""
        names = list(self.space)
        return sorted(
            {
                names[i]
                for q in self.neighbours(p)
                if q not in self.values and self.ok(q)
                for i in range(len(p))
                if q[i] != p[i]
            }
        )

    def ladder_ends(self, p: Point) -> list[str]:
        return [
            n
            for (n, a), v in zip(self.space.items(), p)
            if a.ordered and len(a.ladder) > 1 and v in (a.ladder[0], a.ladder[-1])
        ]


def _finite(x: float) -> float:
    # a diverged run loses, never crashes the search
    return float(x) if x is not None and math.isfinite(x) else math.inf


def grid_search(
    evaluate: Callable[[list[tuple[dict[str, Any], int]]], list[float]],
    space: Mapping[str, Axis],
    seeds: Sequence[int],
    *,
    finalists: int | None = 4,
    max_rounds: int = 8,
    valid: Callable[[dict[str, Any]], bool] | None = None,
) -> dict[str, Any]:
    """Tune one arm over every axis of `space` (lower is better). `evaluate([(setting, seed), ...])` returns the
    loss of each (a harness batch, so runs go in parallel). `finalists=None` runs every point on every seed."""
    if len(set(seeds)) < 1:
        raise ValueError("grid_search needs a tuning seed")
    names = list(space)
    ok = (lambda p: valid(dict(zip(names, p)))) if valid else (lambda p: True)
    g = _Grid(dict(space), list(seeds), ok)

    def run(cells: list[tuple[Point, int]]) -> None:
        cells = [(p, s) for p, s in dict.fromkeys(cells) if s not in g.values.get(p, {})]
        if cells:
            for (p, s), v in zip(cells, evaluate([(dict(zip(names, p)), s) for p, s in cells])):
                g.values.setdefault(p, {})[s] = _finite(v)

    def screen_then_final(points: list[Point]) -> None:
        run([(p, g.seeds[0]) for p in points])
        screened = sorted(g.values, key=lambda p: g.values[p].get(g.seeds[0], math.inf))
        top = screened if finalists is None else screened[:finalists]
        run([(p, s) for p in top for s in g.seeds[1:]])

    todo = [p for p in itertools.product(*(a.start for a in space.values())) if ok(p)]
    rounds = 0
    while todo and rounds < max_rounds:
        rounds += 1
        screen_then_final(todo)
        best = g.complete()[0]
        todo = [q for q in g.neighbours(best) if q not in g.values and ok(q)]
    ranked = g.complete()
    winner = ranked[0]
    runner = ranked[1] if len(ranked) > 1 else None
    edge = g.open_axes(winner)
    return {
        "axes": {n: {"ladder": list(a.ladder), "start": list(a.start), "ordered": a.ordered} for n, a in space.items()},
        "seeds": g.seeds,
        "finalists": finalists,
        "rounds": rounds,
        "points": [
            {
                "setting": dict(zip(names, p)),
                "values": {str(s): v for s, v in vals.items()},
                "mean": g.mean(p) if math.isfinite(g.mean(p)) else None,
            }
            for p, vals in g.values.items()
        ],
        "winner": dict(zip(names, winner)),
        "winner_mean": g.mean(winner),
        "winner_values": [g.values[winner][s] for s in g.seeds],
        "runner_up": None if runner is None else dict(zip(names, runner)),
        "runner_up_mean": None if runner is None else g.mean(runner),
        "bracketed": not edge,
        "open_axes": edge,
        "at_ladder_end": g.ladder_ends(winner),
        "disagreement": disagreement(g, winner, runner),
        "runs": sum(len(v) for v in g.values.values()),
    }


def disagreement(g: _Grid, winner: Point, runner: Point | None) -> dict[str, Any]:
    """Do the tuning seeds agree at the chosen points? noise = the median over the fully evaluated points of
    their spread (max − min over tuning seeds); the winner or runner-up above DISAGREE_FACTOR x noise, or the
    seeds' own winners differing by more than the noise, is flagged."""
    done = g.complete()
    spread = {
        p: max(g.values[p].values()) - min(g.values[p].values())
        for p in done
        if all(map(math.isfinite, g.values[p].values()))
    }
    out: dict[str, Any] = {
        "noise": None,
        "winner_spread": spread.get(winner),
        "runner_up_spread": spread.get(runner),
        "per_seed_winner": {},
        "flagged": False,
        "why": [],
    }
    if len(g.seeds) < 2:
        out["why"].append("one tuning seed: agreement unknown")
        return out
    for s in g.seeds:
        best = min(done, key=lambda p, s=s: g.values[p][s])
        out["per_seed_winner"][str(s)] = dict(zip(g.space, best))
    if len(spread) < 3:
        out["why"].append("fewer than 3 points on every tuning seed: noise unknown")
        return out
    noise = statistics.median(spread.values())
    out["noise"] = noise
    for label, p in (("winner", winner), ("runner-up", runner)):
        if p is not None and spread.get(p, 0.0) > DISAGREE_FACTOR * max(noise, 1e-12):
            out["why"].append(
                f"the {label}'s tuning seeds differ by {spread[p]:.4f}, {spread[p] / max(noise, 1e-12):.1f}x the noise"
            )
    picks = list(dict.fromkeys(tuple(w.values()) for w in out["per_seed_winner"].values()))
    for a, b in itertools.combinations(picks, 2):  # a rank reversal larger than the noise on both seeds
        d = [g.values[a][s] - g.values[b][s] for s in g.seeds]
        if min(d) < -noise and max(d) > noise:
            out["why"].append(
                f"the tuning seeds pick different winners, reversed by {min(-min(d), max(d)):.4f} or more"
            )
            break
    out["flagged"] = bool(out["why"])
    return out


def consistency(tuning_values: Sequence[float], eval_values: Sequence[float]) -> dict[str, Any]:
    """The tuning seeds' mean at the winner against the evaluation seeds': how many eval-seed stds apart
    (a winner picked on a lucky or bimodal tuning seed shows here)."""
    ev = [float(x) for x in eval_values]
    sd = statistics.stdev(ev) if len(ev) > 1 else math.nan
    gap = statistics.fmean(tuning_values) - statistics.fmean(ev)
    z = abs(gap) / sd if sd and math.isfinite(sd) and sd > 0 else None
    return {
        "tuning_mean": statistics.fmean(tuning_values),
        "eval_mean": statistics.fmean(ev),
        "eval_std": sd,
        "gap": gap,
        "eval_stds_apart": z,
        "flagged": z is not None and z > DISAGREE_FACTOR,
    }


def describe_consistency(c: Mapping[str, Any] | None) -> str:
    """`consistency` in a few words: the gap, and how many eval-seed stds it is."""
    if not c:
        return ""
    apart = c.get("eval_stds_apart")
    return f"{c['gap']:+.4f}" + (
        "" if apart is None else f" ({apart:.1f} eval stds{', FLAGGED' if c['flagged'] else ''})"
    )


def describe_tuning(
    t: Mapping[str, Any], fmt_setting: Callable[[Mapping[str, Any]], str] = lambda s: json.dumps(s)
) -> str:
    """One line per arm's search: winner, runner-up, bracketing, agreement."""
    s = (
        f"{fmt_setting(t['winner'])} ({t['winner_mean']:.4f}, {len(t['seeds'])} tuning seeds)"
        + (f"; runner-up {fmt_setting(t['runner_up'])} ({t['runner_up_mean']:.4f})" if t.get("runner_up") else "")
        + f"; {t['runs']} runs, {t['rounds']} rounds; "
        + ("bracketed" if t["bracketed"] else "ON THE EDGE: " + ", ".join(t["open_axes"]))
        + (f" (at the ladder's end: {', '.join(t['at_ladder_end'])})" if t.get("at_ladder_end") else "")
    )
    d = t["disagreement"]
    if d["flagged"]:
        s += "; TUNING SEEDS DISAGREE: " + "; ".join(d["why"])
    elif d["noise"] is not None:
        s += f"; tuning seeds agree (noise {d['noise']:.4f})"
    return s
