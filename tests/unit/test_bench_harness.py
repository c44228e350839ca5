"""The benchmark harness: statistics, clean-SHA refusal, resume from cache, relative paths, JSON->TXT."""

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks import harness as H


def test_mean_std_is_sample_std():
    ms = H.mean_std([1.0, 2.0, 4.0])
    assert ms["mean"] == pytest.approx(7 / 3)
    assert ms["std"] == pytest.approx(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) ** 0.5 / 2**0.5)
    assert ms["n"] == 3 and H.mean_std([5.0])["std"] == 0.0
    with pytest.raises(ValueError):
        H.mean_std([])


def _repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "benchmarks" / "results").mkdir(parents=True)
    (root / "decentrain").mkdir()
    (root / "decentrain" / "a.py").write_text("x = 1\n")
    (root / "benchmarks" / "b.py").write_text("y = 1\n")
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "."], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "init"], cwd=root, check=True)
    return root


def test_dirty_tree_is_refused_or_marked(tmp_path):
    root = _repo(tmp_path)
    sha, marked = H.clean_sha(root=root)
    assert len(sha) == 40 and not marked
    (root / "benchmarks" / "results" / "r.json").write_text("{}")  # results don't dirty the tree
    assert H.clean_sha(root=root) == (sha, False)
    (root / "decentrain" / "a.py").write_text("x = 2\n")
    with pytest.raises(H.DirtyTreeError):
        H.clean_sha(root=root)
    assert H.clean_sha(allow_dirty=True, root=root) == (sha, True)


def test_code_version_changes_with_uncommitted_code(tmp_path):
    root = _repo(tmp_path)
    v0 = H.code_version(root / "benchmarks" / "b.py", root)
    assert H.code_version(root / "benchmarks" / "b.py", root) == v0
    (root / "README.md").write_text("docs\n")  # unrelated dirt keeps the key: a resume still finds its runs
    assert H.code_version(root / "benchmarks" / "b.py", root) == v0
    (root / "decentrain" / "a.py").write_text("x = 3\n")
    assert H.code_version(root / "benchmarks" / "b.py", root) != v0


def test_resume_from_cache_runs_each_job_once(tmp_path):
    root = _repo(tmp_path)
    calls = []

    def fn(job):
        calls.append(job["seed"])
        return {"loss": float(job["seed"]), "dir": str(root / "runs" / f"s{job['seed']}")}

    jobs = [{"lr": 0.5, "seed": s} for s in range(3)]
    h = H.Harness("t", root / "benchmarks" / "b.py", {"out": str(root / "x")}, cache_dir=tmp_path / "cache", root=root)
    h.run_jobs(jobs[:2], fn)  # "interrupted" after two seeds
    h2 = H.Harness("t", root / "benchmarks" / "b.py", {}, cache_dir=tmp_path / "cache", root=root)
    res = h2.run_jobs(jobs, fn)
    assert calls == [0, 1, 2] and h2.reused == 2
    assert len(h2.job_seconds) == 3 and h2.untimed == 0  # resumed runs keep their measured time
    assert [r["loss"] for r in res] == [0.0, 1.0, 2.0]
    assert res[0]["dir"] == "runs/s0"  # cached relative
    assert h.config == {"out": "x"}
    h3 = H.Harness("t", root / "benchmarks" / "b.py", {}, cache_dir=tmp_path / "cache", root=root, fresh=True)
    h3.run_jobs(jobs[:1], fn)
    assert calls == [0, 1, 2, 0]


def test_torn_cache_line_is_skipped(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"key": "a", "config": {}, "result": 1}) + '\n{"key": "b", "res')
    assert H.RunCache(p).entries == {"a": 1}


def test_relativize_paths():
    root = H.ROOT
    obj = {"p": root / "runs" / "x", "s": f"wrote {root}/benchmarks/results/a.json", "o": "/etc/hosts", "n": 3}
    assert H.relativize(obj) == {"p": "runs/x", "s": "wrote benchmarks/results/a.json", "o": "/etc/hosts", "n": 3}


def test_write_generates_txt_and_png_from_json(tmp_path):
    root = _repo(tmp_path)
    h = H.Harness("t", root / "benchmarks" / "b.py", {"k": 1}, cache_dir=tmp_path / "cache", root=root)

    def text(rec):
        return H.header(rec) + f"\nloss {H.fmt(rec['figures']['loss'])}"

    def plot(rec, png):
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots()
        ax.plot(rec["figures"]["loss"]["values"])
        fig.savefig(png)
        plt.close(fig)

    paths = h.write({"loss": H.mean_std([1.0, 3.0])}, text, plot, results_dir=tmp_path / "res")
    rec = json.loads(paths["json"].read_text())
    assert rec["git_sha"] == h.sha and rec["not_for_commit"] is False and rec["config"] == {"k": 1}
    assert "loss 2.0000 ± 1.4142" in paths["txt"].read_text()
    assert paths["png"].stat().st_size > 0


def _square(job):
    return {"y": job["x"] ** 2}


def test_parallel_jobs_keep_order_and_cache(tmp_path):
    root = _repo(tmp_path)
    h = H.Harness("p", root / "benchmarks" / "b.py", {}, cache_dir=tmp_path / "cache", root=root)
    jobs = [{"x": x} for x in (3, 1, 2, 1)]  # a duplicate runs once
    assert [r["y"] for r in h.run_jobs(jobs, _square, parallel=2)] == [9, 1, 4, 1]
    h2 = H.Harness("p", root / "benchmarks" / "b.py", {}, cache_dir=tmp_path / "cache", root=root)
    h2.run_jobs(jobs, _square)
    assert h2.reused == 4 and len(h2.job_seconds) == 3


def test_record_is_in_the_one_schema_with_its_provenance(tmp_path, monkeypatch):
    root = _repo(tmp_path)
    monkeypatch.setattr("sys.argv", [str(root / "benchmarks" / "b.py"), "--seeds", "2"])
    h = H.Harness("t", root / "benchmarks" / "b.py", {"k": 1}, cache_dir=tmp_path / "cache", root=root)
    rec = json.loads(h.write({"x": 1.0}, lambda r: "x", results_dir=tmp_path / "res")["json"].read_text())
    assert H.validate_record(rec) == []
    assert rec["command"] == "python -m benchmarks.b --seeds 2" and rec["dirty"] is False
    assert rec["compute_s"] == rec["wall_s_this_invocation"]  # no harness jobs: the invocation was the compute
    (root / "decentrain" / "a.py").write_text("x = 5\n")
    d = H.Harness("t", root / "benchmarks" / "b.py", {}, cache_dir=tmp_path / "cache", root=root, allow_dirty=True)
    rec = d.record({})
    assert rec["dirty"] and rec["not_for_commit"] and len(rec["git_sha"]) == 40  # never a "-dirty" suffix


def test_smoke_run_writes_beside_never_over_committed_results(tmp_path, monkeypatch):
    root = _repo(tmp_path)
    (root / "decentrain" / "a.py").write_text("x = 4\n")  # a smoke run may run on a dirty tree
    monkeypatch.setattr(H, "SMOKE_DIR", tmp_path / "smoke")
    h = H.Harness("t", root / "benchmarks" / "b.py", {}, cache_dir=tmp_path / "cache", root=root, smoke=True)
    paths = h.write({"x": 1.0}, lambda r: "x")
    assert (
        paths["json"].parent == tmp_path / "smoke" and json.loads(paths["json"].read_text())["not_for_commit"] is True
    )


def test_one_command_line_with_smoke_defaults_and_seed_lists():
    ap = H.bench_parser("d", smoke={"steps": 4, "seeds": 1})
    ap.add_argument("--steps", type=int, default=640)
    args = H.parse(ap, [])
    assert (args.steps, args.seeds, args.smoke, args.fresh, args.allow_dirty) == (640, 3, False, False, False)
    args = H.parse(ap, ["--smoke", "--steps", "8"])  # smoke defaults apply; a flag given still wins
    assert (args.steps, args.seeds, args.smoke) == (8, 1, True)
    assert H.own_flags(args) == {"steps": 8, "seeds": 1}
    with pytest.raises(SystemExit):
        H.parse(H.bench_parser("d"), ["--seeds", "0"])
    lists = H.bench_parser("d", seeds=1, seed_lists=True)
    assert H.seed_list(H.parse(lists, ["--seeds", "0,2,5"]).seeds) == [0, 2, 5]
    assert H.seed_list(H.parse(lists, ["--seeds", "5,"]).seeds) == [5]
    assert H.seed_list(H.parse(lists, []).seeds) == [0]
    assert not hasattr(H.parse(H.bench_parser("d", seeds=None), []), "seeds")
