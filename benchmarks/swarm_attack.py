"""swarm_attack: honest SAPO nodes over a loopback hivemind DHT, one hostile peer per attack.

For each scenario, two honest nodes (`python -m recipes.rl sapo=hivemind`, tiny model) join a
fresh swarm; once both have trained a round, the attacker joins and attacks for `--seconds`.
Per scenario: rounds completed, external records received (rate per round), peak and growth of
RSS (node + its DHT process and p2p daemon), crashes, and files created by RCE markers; each
ratio is over the no-attack run of the same seed (`--seeds`: every row once per seed; the table
gives mean ± std and the minimum over seeds); `none_again`, a second no-attack run at the end,
shows the drift between identical runs on this machine. The no-attack runs have a benign third
member in the attacker's place (an empty valid payload every 0.5 s), so that on one shared box a
ratio does not count the CPU any third member's DHT process takes as the attack's doing. Target:
mean >= 0.9 of the no-attack rounds/s and external rate, 0 crashes, 0 files.

Attackers (one per scenario):
  payload level, published by a member with a valid DHT identity through a HivemindExchange:
    rce (5 eval-verifier tasks), timestamp (400 digits), spoofing (wrong answers + matching
    completions), metadata_bomb (~1 MiB), id_spoofing (honest names, RTL/zero-width/NUL ids),
    sandbox_forgery (the old verifier-sandbox escapes on questions the nodes rebuild),
    rebuild_amplification (64 fresh entries per payload, each with a wrong question),
    tail_injection (right answers followed by text after the stop string, or after 60 spaces),
    group_hijack (the honest nodes' just-published groups republished unchanged under the
    attacker's key, plus 9 wrong-question groups that put it over its sender budget)
  DHT level (decentrain/testing/dht_attacks.py, re-run every `--reattack-s`):
    big_records (> 4 MiB under the swarm keys), far_future_ttl (under the honest nodes'
    subkeys), whole_key (one value over each key), flood_1000, stale_replay (captured honest
    records replayed as round 0), registry_eclipse (one key, 40 registry subkeys of ~700 KB),
    sybil_crowding (32 fresh keys, each listed with a ~0.5 MiB record of valid shape),
    registry_poison (the signed non-msgpack value b"\\xc1" under the registry key),
    slow_responder (the attacker's DHT answers every find and store after 2.5 s)
  Sybils: sybils_64 (64 fresh identities, each publishing 4 usable groups of real entries every
    0.5 s, all within their own cost budgets)

    python -m benchmarks.swarm_attack            # 19 attacks + 2 no-attack runs, one seed, ~30 min on 2 cores
    python -m benchmarks.swarm_attack --seeds 0,1,2 --attacks group_hijack,registry_poison
    python -m benchmarks.swarm_attack --smoke    # baseline + 2 attacks, short windows (written under runs/bench_smoke)
    python -m benchmarks.swarm_attack --resume   # after an interruption: skips the finished scenarios
    python -m benchmarks.swarm_attack --report-partial   # tables from the finished scenarios only
    python -m benchmarks.swarm_attack --attacks flood_1000 --seconds 600 --baseline-seconds 60 \
        --reattack-s 5 --name swarm_attack_flood10   # memory under a 10-minute flood
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.harness import RESULTS, Harness, bench_parser, own_flags, parse, read_live_jsonl, save_figure, seed_list
from decentrain.testing import dht_attacks as shapes
from decentrain.testing.recipes import TINY_RL

ROOT = Path(__file__).resolve().parents[1]
TINY = [  # the test kit's tiny SAPO node, run long and quiet
    *TINY_RL,
    "logger.console=false",
    "batch.num_local=2",
    "batch.num_external=2",
    "train.rounds=100000",
    "train.checkpoint_every=0",
    "exchange.hivemind.wait_s=0.5",
    "resume=false",
]
G = 4  # loss.num_generations above
EVAL_TASKS = ["string_insertion", "number_sorting", "polynomial_multiplication", "spiral_matrix", "binary_matrix"]
PAYLOAD_ATTACKS = [
    "rce",
    "timestamp",
    "spoofing",
    "metadata_bomb",
    "id_spoofing",
    "sandbox_forgery",
    "rebuild_amplification",
    "tail_injection",
    "group_hijack",
]
HONEST_TASK_MIX = "arith_legs"  # conf/rl.yaml's default task group: what the honest nodes rebuild
DEFAULT_TASK = "chain_sum"  # in that mix: its questions are real to honest nodes
DHT_ATTACKS = [
    "big_records",
    "far_future_ttl",
    "whole_key",
    "flood_1000",
    "stale_replay",
    "registry_eclipse",
    "sybil_crowding",
    "registry_poison",
    "slow_responder",
    "sybils_64",
]
# Control rows: the no-attack run first (every ratio's denominator) and again last, whose ratio
# shows how far two identical runs drift apart on this machine (the noise floor of every row).
# Their third member is benign (it joins the DHT and publishes a valid payload of no groups every
# 0.5 s, as a payload attacker does), so a ratio measures the attack, not the CPU that any third
# member's DHT process and daemon take from the honest nodes on the same 2 cores (without it,
# attacks that the nodes refuse in microseconds read 0.83-0.89 of the rounds).
NO_ATTACK = ("none", "none_again")
SYBILS = 64  # sybils_64: fresh identities, each publishing usable groups within its own budget
SYBIL_GROUPS = 4  # groups per Sybil payload
HIJACK_JUNK = 9  # group_hijack: wrong-question groups added to the copied ones, to go over the sender budget
# The escapes of the old verifier sandbox (issue 16): reach `sys`, switch the audit hook off, score 1.0 for anything.
_FORGE = ".modules['__main__'].__dict__.update({'_DENIED': (), '_DENIED_PREFIXES': ('~',), 'float': id})"
FORGERIES = [
    "[c for c in ().__class__.__base__.__subclasses__() if c.__name__=='catch_warnings'][0]"
    ".__init__.__globals__['sys']" + _FORGE,
    "ilcm.__globals__['sys']" + _FORGE,
]


# -- hostile payloads --------------------------------------------------------------------------
# Bodies are built by hand (a hostile peer does not use our encoder), then framed the way the
# current wire format expects, signed with the attacker's own valid key where there is one.


class Framer:
    def __init__(self) -> None:
        from decentrain.algorithms.sapo import payload as p

        self.p = p
        self.new = getattr(p, "_MAGIC", b"DTR1") != b"DTR1"
        if self.new:
            from decentrain.core.identity import NodeIdentity

            self.identity = NodeIdentity.generate()
            self.node_id = self.identity.node_id
        else:
            self.identity, self.node_id = None, "attacker"

    def frame(self, body: bytes) -> bytes:
        if self.new:
            return b" ".join([self.p._MAGIC, self.identity.node_id.encode(), self.identity.sign(body)]) + b"\n" + body
        return b"DTR1\n" + body

    def group(self, task: str, question: str, answer: str, completions: list[str], metadata=None) -> dict:
        if self.new:
            return {
                "task": task,
                "config": "0" * 16,
                "seed": 0,
                "size": 100,
                "index": 0,
                "question": question,
                "completions": completions,
            }
        return {
            "question": question,
            "answer": answer,
            "task": task,
            "metadata": metadata or {},
            "completions": completions,
        }

    def real_group(self, item, completions: list[str], question: str | None = None, index: int | None = None) -> dict:
        """A group addressing a real entry of the honest nodes' mix (so it is rebuilt and scored)."""
        ref = item.ref
        return {
            "task": ref.task,
            "config": ref.config,
            "seed": ref.seed,
            "size": ref.size,
            "index": ref.index if index is None else index,
            "question": item.question if question is None else question,
            "completions": completions,
        }

    def body(self, round_: int, groups: list[dict], timestamp=None, node_id=None, name="attacker") -> bytes:
        obj = {
            "version": 1,
            "node_id": node_id or self.node_id,
            "round": round_,
            "timestamp": time.time() if timestamp is None else timestamp,
            "groups": groups,
        }
        if self.new:
            obj["name"] = name
        return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def hijack_payload(fr: Framer, round_: int, honest: list[bytes]) -> bytes | None:
    """group_hijack: the honest peers' latest groups, unchanged, republished under the attacker's
    own key, plus HIJACK_JUNK wrong-question groups that put this sender over its cost budget.
    (On the old receiver the copied groups were charged to whoever sent them first by content:
    the victim's own local groups became unscorable and its round raised.)"""
    groups = []
    for data in honest:
        try:
            groups += json.loads(data.split(b"\n", 1)[1])["groups"]
        except (ValueError, KeyError, IndexError, TypeError):
            continue
    if not groups:
        return None
    item = _questions(DEFAULT_TASK)[0]
    junk = [
        fr.real_group(item, ["1"] * G, question=f"q{round_}-{i}", index=(round_ * HIJACK_JUNK + i) % item.ref.size)
        for i in range(HIJACK_JUNK)
    ]
    return fr.frame(fr.body(round_, groups[: 64 - HIJACK_JUNK] + junk))


def sybil_payload(fr: Framer, index: int, round_: int) -> bytes:
    """sybils_64: SYBIL_GROUPS real entries of the honest mix, half-right completions (usable: rewards differ)."""
    items = _questions(DEFAULT_TASK, 64)
    groups = [
        fr.real_group(
            items[(index * SYBIL_GROUPS + k) % len(items)],
            [items[(index * SYBIL_GROUPS + k) % len(items)].answer, "0"] * (G // 2),
        )
        for k in range(SYBIL_GROUPS)
    ]
    return fr.frame(fr.body(round_, groups, name=f"sybil{index}"))


def _rce_markers(path: Path) -> list[str]:
    return [
        f'__import__("os").system("touch {path}_a")',
        f'[open("{path}_b", "w")]',
        f'[__import__("pathlib").Path("{path}_c").touch()]',
        '[open("rel_marker", "w")]',
    ]


@functools.lru_cache(maxsize=None)
def _questions(task: str, n: int = 1):
    """`n` entries of `task`: for a task of the honest nodes' mix, entries of that very mix (its
    task config and seeds, task.size=100 as in TINY), so groups addressing them rebuild there and
    reach the scorers; for any other task, a mix of its own (refused as task_not_in_mix)."""
    from omegaconf import OmegaConf

    from decentrain.tasks import TaskMixConfig, TaskMixture

    honest = OmegaConf.to_container(OmegaConf.load(ROOT / "conf" / "task" / f"{HONEST_TASK_MIX}.yaml"))
    honest.pop("defaults", None)
    if task not in honest["tasks"]:
        mix = TaskMixture(TaskMixConfig(tasks=[task], size=100))
        return [mix[i] for i in range(n)]
    mix = TaskMixture(TaskMixConfig(**{**honest, "size": 100}))
    items = {it.ref.index: it for it in (mix[i] for i in range(100 * len(honest["tasks"]))) if it.task == task}
    return list(items.values())[:n]


def hostile_payloads(kind: str, fr: Framer, round_: int, marker_dir: Path) -> list[bytes]:
    if kind in NO_ATTACK:  # the benign third member of the control rows
        return [fr.frame(fr.body(round_, []))]
    if kind == "rce":
        groups = []
        for task in EVAL_TASKS:
            item = _questions(task)[0]
            marks = _rce_markers(marker_dir / task)
            completions = [f"<answer>{m}</answer>" if i % 2 else m for i, m in enumerate(marks)][:G]
            answer = marks[0] if task == "number_sorting" else item.answer  # number_sorting evals its answer
            groups.append(fr.group(task, item.question, answer, completions, item.metadata))
        return [fr.frame(fr.body(round_, groups))]
    if kind == "timestamp":
        item = _questions(DEFAULT_TASK)[0]
        body = fr.body(round_, [fr.group(item.task, item.question, item.answer, [item.answer] * G)], timestamp=0)
        return [fr.frame(body.replace(b'"timestamp":0', b'"timestamp":' + b"9" * 400))]
    if kind == "spoofing":  # real questions of the default mix, wrong answers, completions that match them
        groups = [
            fr.group(it.task, it.question, "123456789", ["123456789"] * G, it.metadata)
            for it in _questions(DEFAULT_TASK, 4)
        ]
        return [fr.frame(fr.body(round_, groups))]
    if kind == "metadata_bomb":  # ~1 MiB of tiny values in one group's metadata (an unexpected field today)
        item = _questions(DEFAULT_TASK)[0]
        group = fr.group(item.task, item.question, item.answer, [item.answer] * G)
        group["metadata"] = {f"k{i}": [i, [i]] for i in range(60_000)}
        return [fr.frame(fr.body(round_, [group]))]
    if kind == "id_spoofing":
        item = _questions(DEFAULT_TASK)[0]
        g = [fr.group(item.task, item.question, item.answer, [item.answer] * G)]
        names = ["node0", "node1", "", "\x00node0", "\u202enode0", "node\u200b0"]
        if fr.new:  # ids are public keys now: claim the names, and a node_id that is not the signing key
            out = [fr.frame(fr.body(round_, g, name=n)) for n in names]
            other = type(fr.identity).generate().node_id
            return out + [fr.frame(fr.body(round_, g, node_id=other))]
        return [fr.frame(fr.body(round_, g, node_id=n)) for n in names]
    if kind == "sandbox_forgery":  # the old sandbox escape, on questions the honest nodes rebuild and score
        groups = [fr.real_group(it, [FORGERIES[i % 2]] * G) for i, it in enumerate(_questions(DEFAULT_TASK, 4))]
        return [fr.frame(fr.body(round_, groups))]
    if kind == "tail_injection":  # correct answers with text after the stop string, or padding before it
        groups = [
            fr.real_group(
                it,
                [f"{it.answer}\nSEND ALL KEYS", " " * 60 + f"{it.answer}\n", f"{it.answer}\n" + "junk " * 200, "0"][:G],
            )
            for it in _questions(DEFAULT_TASK, 4)
        ]
        return [fr.frame(fr.body(round_, groups))]
    if kind == "rebuild_amplification":  # 64 fresh entries, each with a wrong question: rebuilt, then refused
        item = _questions(DEFAULT_TASK)[0]
        groups = [
            fr.real_group(item, ["1"] * G, question=f"q{round_}-{i}", index=(round_ * 64 + i) % item.ref.size)
            for i in range(64)
        ]
        return [fr.frame(fr.body(round_, groups))]
    raise ValueError(kind)


# -- processes and measurements ----------------------------------------------------------------


def _env() -> dict:
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "offline",
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(ROOT),
    }


def _rows(run_dir: Path, node: str) -> list[dict]:
    return read_live_jsonl(run_dir / node / "metrics.jsonl")


def _tree_rss_mib(pid: int) -> float:
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0.0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


class Attacker:
    """One attack: `prepare()` joins the swarm (before the measured window), `thread` attacks until `stop`."""

    def __init__(self, kind: str, peers: list[str], prefix: str, marker_dir: Path, reattack_s: float):
        self.kind, self.peers, self.prefix, self.marker_dir, self.reattack_s = (
            kind,
            peers,
            prefix,
            marker_dir,
            reattack_s,
        )
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.actions = 0
        self.members: list = []  # payload attacks: one valid DHT member
        self.dht = None
        self.hijack: bytes | None = None  # group_hijack: the next copied payload
        self.sybils: list[Framer] = []  # sybils_64: one signing identity each
        self.thread = threading.Thread(target=self._run, daemon=True)

    def prepare(self) -> None:
        if self.kind in PAYLOAD_ATTACKS or self.kind in NO_ATTACK:
            from decentrain.algorithms.sapo.exchange import ExchangeConfig, HivemindConfig, build_exchange
            from decentrain.core.world import World

            cfg = ExchangeConfig(
                name="hivemind", hivemind=HivemindConfig(initial_peers=self.peers, prefix=self.prefix, wait_s=0.0)
            )
            self.framer = Framer()
            self.members = [build_exchange(cfg, World(), "attacker")]
        else:
            self.dht = shapes.attacker_dht(self.peers)
            self.sybils = [Framer() for _ in range(SYBILS if self.kind == "sybils_64" else 0)]
            if self.kind == "stale_replay":
                self.actions += shapes.run_capture(self.dht, self.prefix)

    def _run(self) -> None:
        try:
            round_ = 0
            while not self.stop.is_set():
                if self.kind == "group_hijack":  # republish what the honest peers just published
                    got = self.members[0].exchange(
                        round_, self.hijack or self.framer.frame(self.framer.body(round_, []))
                    )
                    self.hijack = hijack_payload(self.framer, round_ + 1, [r.data for r in got]) or self.hijack
                    self.actions += 1
                    round_ += 1
                    self.stop.wait(0.05)
                    continue
                if self.kind == "sybils_64":  # every Sybil publishes a new round of usable groups
                    from decentrain.algorithms.sapo.dht_guard import compress

                    for i, fr in enumerate(self.sybils):
                        data = compress(sybil_payload(fr, i, round_))
                        self.actions += shapes.run_publish_as(self.dht, self.prefix, i, round_, data)
                    round_ += 1
                    self.stop.wait(0.5)
                    continue
                if self.members:  # one hostile payload per round, cycling through the variants
                    variants = hostile_payloads(self.kind, self.framer, round_, self.marker_dir)
                    self.members[0].exchange(round_, variants[round_ % len(variants)])
                    self.actions += 1
                    round_ += 1
                    self.stop.wait(0.5)
                    continue
                if self.kind == "stale_replay":
                    self.actions += shapes.run_replay(self.dht, self.prefix)
                else:
                    self.actions += shapes.run_shape(self.dht, self.kind, self.prefix)
                self.stop.wait(self.reattack_s)
        except Exception as e:  # the attacker's own failure is reported, not fatal to the benchmark
            self.errors.append(repr(e)[:300])

    def close(self) -> None:
        for ex in self.members:
            ex.close()
        if self.dht is not None:
            self.dht.shutdown()


def run_scenario(kind: str, args: argparse.Namespace, work: Path, seed: int = 0) -> dict:
    work = work / f"seed{seed}"
    run_dir, cwd, marker_dir = work / kind / "run", work / kind / "cwd", work / kind / "markers"
    for d in (run_dir, cwd, marker_dir):
        d.mkdir(parents=True)
    peers_file = work / kind / "peers.txt"
    prefix = f"atk_{kind}_{seed}_{os.getpid()}"
    nodes = ["node0", "node1"]

    def start(i: int) -> subprocess.Popen:
        cmd = [
            sys.executable,
            "-m",
            "recipes.rl",
            *TINY,
            "sapo=hivemind",
            f"node_index={i}",
            f"run_dir={run_dir}",
            f"train.seed={seed}",
            f"exchange.hivemind.peers_file={peers_file}",
            f"exchange.hivemind.prefix={prefix}",
        ]
        # Own session per node: stopping its process group takes its DHT process and p2p daemon too.
        return subprocess.Popen(
            cmd,
            cwd=cwd,
            env=_env(),
            stdout=subprocess.DEVNULL,
            stderr=open(work / kind / f"node{i}.log", "wb"),
            start_new_session=True,
        )

    procs = [start(0)]
    t0 = time.monotonic()
    while not (peers_file.exists() and peers_file.read_text().strip()) and time.monotonic() - t0 < 120:
        time.sleep(0.5)
    procs.append(start(1))
    while not all(_rows(run_dir, n) for n in nodes) and time.monotonic() - t0 < 180:
        time.sleep(0.5)
    peers = [line.strip() for line in peers_file.read_text().splitlines() if line.strip()]
    attacker = Attacker(kind, peers, prefix, marker_dir, args.reattack_s)  # benign in the control rows
    attacker.prepare()
    attacker.thread.start()
    start_rows = {n: len(_rows(run_dir, n)) for n in nodes}
    rss = {n: [] for n in nodes}
    crashed = {n: False for n in nodes}
    t_start = time.monotonic()
    seconds = args.baseline_seconds if kind in NO_ATTACK and args.baseline_seconds else args.seconds
    while time.monotonic() - t_start < seconds:
        for n, p in zip(nodes, procs):
            crashed[n] |= p.poll() is not None
            rss[n].append(_tree_rss_mib(p.pid))
        time.sleep(2.0)
    window = time.monotonic() - t_start
    attacker.stop.set()
    attacker.thread.join(timeout=60)
    attacker.close()
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
    files = sorted(
        str(f.relative_to(work / kind))
        for d in (marker_dir, cwd)
        for f in d.rglob("*")
        if f.is_file() and not f.name.endswith(".log") and "outputs" not in f.parts
    )
    per_node = {}
    for n in nodes:
        rows = _rows(run_dir, n)[start_rows[n] :]
        samples = [r for r in rss[n] if r > 0]
        per_node[n] = {
            "rounds": len(rows),
            "external_received": sum(r.get("external_received", 0) for r in rows),
            "external_per_round": sum(r.get("external_received", 0) for r in rows) / max(len(rows), 1),
            "payloads_dropped": rows[-1].get("payloads_dropped", 0) if rows else None,
            "rss_first_mib": samples[0] if samples else None,
            "rss_peak_mib": max(samples) if samples else None,
            "rss_last_mib": samples[-1] if samples else None,
            "crashed": crashed[n],
        }
    return {
        "attack": kind,
        "seed": seed,
        "window_s": window,
        "nodes": per_node,
        "files_created": files,
        "crashes": sum(crashed.values()),
        "rounds": sum(v["rounds"] for v in per_node.values()),
        "external_per_round": sum(v["external_received"] for v in per_node.values())
        / max(sum(v["rounds"] for v in per_node.values()), 1),
        "rss_growth_mib": max((v["rss_last_mib"] or 0) - (v["rss_first_mib"] or 0) for v in per_node.values()),
        "rss_peak_mib": max((v["rss_peak_mib"] or 0) for v in per_node.values()),
        "attacker_actions": attacker.actions if attacker else 0,
        "attacker_errors": attacker.errors if attacker else [],
    }


def _ratios(run: dict, base: dict) -> tuple[float, float, float]:
    """(rounds/s, external groups per round, external groups per second), each over the same
    seed's no-attack run. A node stops polling once `min_peers` valid payloads arrived, so an
    attacker publishing valid payloads often makes its rounds shorter: rounds/s rise and external
    groups per round fall while external groups per second do not; the table shows all three."""
    nan = float("nan")
    rr = (run["rounds"] / run["window_s"]) / (base["rounds"] / base["window_s"]) if base["rounds"] else nan
    er = run["external_per_round"] / base["external_per_round"] if base["external_per_round"] else nan
    return rr, er, rr * er


def _mean_std(xs: list[float]) -> tuple[float, float]:
    import statistics

    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def summarize(runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Per attack: mean ± std over seeds of both ratios, crashes and files summed, and the target."""
    out = {}
    for kind, per_seed in runs.items():
        ratios = [_ratios(r, runs["none"][i]) for i, r in enumerate(per_seed)]
        for r, (rr, er, xr) in zip(per_seed, ratios):
            r["rounds_ratio"], r["external_ratio"], r["external_per_s_ratio"] = rr, er, xr
        (rr_m, rr_s), (er_m, er_s) = _mean_std([a for a, _, _ in ratios]), _mean_std([b for _, b, _ in ratios])
        xr_m, xr_s = _mean_std([c for _, _, c in ratios])
        crashes = sum(r["crashes"] for r in per_seed)
        files = sum(len(r["files_created"]) for r in per_seed)
        out[kind] = {
            "seeds": len(per_seed),
            "rounds": [r["rounds"] for r in per_seed],
            "external_per_round": [r["external_per_round"] for r in per_seed],
            "rounds_ratio_mean": rr_m,
            "rounds_ratio_std": rr_s,
            "external_ratio_mean": er_m,
            "external_ratio_std": er_s,
            "rounds_ratio_min": min(a for a, _, _ in ratios),
            "external_ratio_min": min(b for _, b, _ in ratios),
            "external_per_s_ratio_mean": xr_m,
            "external_per_s_ratio_std": xr_s,
            "crashes": crashes,
            "files": files,
            "rss_peak_mib": max(r["rss_peak_mib"] for r in per_seed),
            "rss_growth_mib": max(r["rss_growth_mib"] for r in per_seed),
            "ok": rr_m >= 0.9 and er_m >= 0.9 and crashes == 0 and files == 0,
        }
    return out


def _table(summary: dict[str, dict]) -> str:
    lines = [
        "| attack | seeds | rounds/s ratio (mean ± std, min) | ext/round ratio (mean ± std, min) | ext/s ratio | "
        "RSS peak MiB | RSS growth MiB | crashes | files | ok |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, r in summary.items():
        lines.append(
            f"| {kind} | {r['seeds']} | {r['rounds_ratio_mean']:.2f} ± {r['rounds_ratio_std']:.2f} "
            f"({r['rounds_ratio_min']:.2f}) | {r['external_ratio_mean']:.2f} ± {r['external_ratio_std']:.2f} "
            f"({r['external_ratio_min']:.2f}) | {r['external_per_s_ratio_mean']:.2f} | "
            f"{r['rss_peak_mib']:.0f} | {r['rss_growth_mib']:+.0f} | "
            f"{r['crashes']} | {r['files']} | {'yes' if r['ok'] else 'NO'} |"
        )
    return "\n".join(lines)


def plot(summary: dict[str, dict], out_png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(summary)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for ax, key, title in zip(
        axes,
        ("rounds_ratio", "external_ratio", "rss_growth_mib"),
        ("rounds/s vs no attack", "external records / round vs no attack", "RSS growth (MiB)"),
    ):
        if key == "rss_growth_mib":
            ax.bar(range(len(kinds)), [summary[k][key] for k in kinds], color="tab:blue")
        else:
            ax.bar(
                range(len(kinds)),
                [summary[k][f"{key}_mean"] for k in kinds],
                yerr=[summary[k][f"{key}_std"] for k in kinds],
                color="tab:blue",
                capsize=2,
            )
            ax.axhline(0.9, color="red", ls="--", lw=1, label="target 0.9")
            ax.legend()
        ax.set_xticks(range(len(kinds)), kinds, rotation=60, ha="right")
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    save_figure(fig, out_png, dpi=110)


def main() -> None:
    ap = bench_parser(__doc__.splitlines()[0], seeds=1, seed_lists=True)
    ap.add_argument("--seconds", type=float, default=45.0, help="measurement window per scenario")
    ap.add_argument("--attacks", default=",".join(PAYLOAD_ATTACKS + DHT_ATTACKS))
    ap.add_argument(
        "--baseline-seconds", type=float, default=None, help="window of the no-attack run (default: --seconds)"
    )
    ap.add_argument("--reattack-s", type=float, default=10.0)
    ap.add_argument("--quick", dest="smoke", action="store_true", help=argparse.SUPPRESS)  # the old name of --smoke
    ap.add_argument("--name", default="swarm_attack")
    ap.add_argument("--resume", action="store_true", help="skip scenarios already in <name>.partial.json")
    ap.add_argument(
        "--report-partial",
        action="store_true",
        help="write JSON/PNG/TXT from <name>.partial.json (an interrupted run) and exit",
    )
    args = parse(ap)
    if args.smoke:
        args.seconds, args.attacks, args.name = 12.0, "timestamp,whole_key", args.name + "_quick"
    kinds = ["none", *[k for k in args.attacks.split(",") if k], "none_again"]
    unknown = set(kinds) - {*NO_ATTACK, *PAYLOAD_ATTACKS, *DHT_ATTACKS}
    if unknown:
        raise SystemExit(f"--attacks: unknown {sorted(unknown)}; allowed {PAYLOAD_ATTACKS + DHT_ATTACKS}")
    seeds = seed_list(args.seeds)  # honest nodes' train.seed; every row runs once per seed
    hz = Harness(args.name, __file__, own_flags(args), allow_dirty=args.allow_dirty, fresh=args.fresh, smoke=args.smoke)
    cache = RESULTS / f"{args.name}.partial.json"  # every finished scenario: a rerun resumes after it
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    if args.report_partial:
        done = json.loads(cache.read_text())
        write_all(hz, args, seeds, {k: v for k, v in done.items() if v and done.get("none")}, float("nan"))
        return
    if args.resume and cache.exists():
        done = json.loads(cache.read_text())
        for kind, per_seed in done.items():
            if kind in runs:
                runs[kind] = [r for r in per_seed if r["seed"] in seeds]
    work = Path(tempfile.mkdtemp(prefix="swarm_attack_"))
    t0 = time.perf_counter()
    try:
        for seed in seeds:
            for kind in kinds:
                if any(r["seed"] == seed for r in runs[kind]):
                    continue  # from the cache
                print(f"seed {seed} {kind}: 2 honest nodes, {args.seconds:.0f} s window", flush=True)
                r = run_scenario(kind, args, work, seed)
                runs[kind].append(r)
                RESULTS.mkdir(parents=True, exist_ok=True)
                cache.write_text(json.dumps(runs, default=str))
                print(
                    f"  rounds {r['rounds']}, ext/round {r['external_per_round']:.2f}, crashes {r['crashes']}, "
                    f"files {len(r['files_created'])}, attacker actions {r['attacker_actions']} {r['attacker_errors']}",
                    flush=True,
                )
    finally:
        if not os.environ.get("SWARM_ATTACK_KEEP"):
            shutil.rmtree(work, ignore_errors=True)
    write_all(hz, args, seeds, {k: v for k, v in runs.items() if v}, time.perf_counter() - t0)
    cache.unlink(missing_ok=True)


def write_all(
    hz: Harness, args: argparse.Namespace, seeds: list[int], runs: dict[str, list[dict]], wall_s: float
) -> None:
    """JSON, PNG and TXT of the finished scenarios (also by `--report-partial` from the cache)."""
    summary = summarize(runs)
    table = _table(summary)
    figures = {
        "scenarios": runs,
        "summary": summary,
        "total_wall_s": wall_s,
        "table": table,
        "all_ok": all(r["ok"] for r in summary.values()),
    }
    hz.write(
        figures,
        lambda _rec: (
            f"swarm_attack ({args.seconds:.0f} s per scenario, 2 honest nodes, seeds {seeds}; ratios are over the same "
            f"seed's no-attack run; target: mean >= 0.9 of rounds/s and ext/round, 0 crashes, 0 files)\n\n{table}\n\n"
            f"all targets met: {figures['all_ok']}\n"
        ),
        lambda _rec, png: plot(summary, png),
    )
    print("\n" + table)


if __name__ == "__main__":
    main()
