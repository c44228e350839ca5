"""`decentrain compare`: every arm gets the same layout, and the table, the reading and the figure
come from the arms' own files: result.json (the run's end) and metrics.jsonl (rank 0's eval loss, wall
time and cumulative bytes), never from their console."""

import json

import pytest

from recipes.comparison import CompareConfig, arm_overrides, read_arm, write_summary


def test_arms_share_the_layout_and_differ_only_in_the_algorithm(tmp_path):
    cfg = CompareConfig(workers=2, steps=40, inner_steps=10, overrides=["model=qwen2_tiny"])
    ddp, noloco = arm_overrides(cfg, "ddp", tmp_path / "ddp"), arm_overrides(cfg, "noloco", tmp_path / "noloco")
    shared = {
        "launcher.nproc_per_node=2",
        "train.steps=40",
        "train.global_batch_size=32",
        "model=qwen2_tiny",
        "resume=false",
    }
    assert shared <= set(ddp) and shared <= set(noloco)
    assert set(noloco) - set(ddp) == {
        "algorithm=noloco",
        "algorithm.inner_steps=10",
        f"run_dir={tmp_path / 'noloco'}",
        f"hydra.run.dir={tmp_path / 'noloco'}",
    }
    assert not any(o.startswith("algorithm.inner_steps") for o in ddp)  # DDP syncs every step


def test_bad_values_name_the_field():
    with pytest.raises(ValueError, match="workers=0"):
        CompareConfig(workers=0)
    with pytest.raises(ValueError, match="algorithms"):
        CompareConfig(algorithms=[])


def _write(run_dir, rows):
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_summary_reads_the_metrics_and_says_who_sent_what(tmp_path):
    _write(
        tmp_path / "ddp",
        [
            {"step": 10, "train/loss": 3.0, "time/train_s": 5.0, "comm/bytes_sent_total": 5e7},
            {"step": 10, "eval/loss": 3.1},
            {"step": 20, "train/loss": 2.0, "time/train_s": 10.0, "comm/bytes_sent_total": 1e8},
            {"step": 20, "eval/loss": 2.5},
        ],
    )
    _write(
        tmp_path / "noloco",
        [
            {"step": 20, "train/loss": 2.6, "time/train_s": 12.0, "comm/bytes_sent_total": 4e6},
            {"step": 20, "eval/loss": 2.9},
        ],
    )
    cfg = CompareConfig(algorithms=["ddp", "noloco"], steps=20, inner_steps=10)
    arms = [read_arm(a, tmp_path / a) for a in cfg.algorithms]
    assert arms[0].step == [10, 20] and arms[0].bytes_sent == [5e7, 1e8] and arms[0].seconds == [5.0, 10.0]
    text = write_summary(arms, cfg, tmp_path)
    assert "25x less" in text  # 1e8 / 4e6
    assert (
        "ddp has the lowest eval loss (2.500) and sends the most (100.0 MB per worker)" in text
        and "noloco sends 25x less than ddp for eval 2.900 (+0.400)" in text
    )
    assert "trail DDP" in text  # the gap is read, with its cause
    assert (tmp_path / "compare.png").stat().st_size > 1000 and json.loads((tmp_path / "compare.json").read_text())[
        "arms"
    ]


def test_an_arm_without_evaluation_is_named(tmp_path):
    _write(tmp_path / "diloco", [{"step": 10, "train/loss": 3.0}])
    with pytest.raises(ValueError, match="the diloco arm did not finish"):
        read_arm("diloco", tmp_path / "diloco")


def test_a_preset_sets_the_layout_and_each_arm_names_what_stands_behind_it(tmp_path):
    from hydra import compose, initialize_config_dir

    from recipes import conf_dir
    from recipes.compare import to_config

    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        small = to_config(compose("compare", overrides=["run_dir=x"]))
        n4 = to_config(
            compose("compare", overrides=["run_dir=x", "compare=bench_n4", "overrides=['model.num_layers=3']"])
        )
    assert (
        small.preset == "cpu_small" and small.steps == 200 and small.arms["diloco"].behind == "untuned defaults, 1 seed"
    )
    assert n4.preset == "bench_n4" and n4.steps == 920 and "model.hidden_size=48" in n4.scale_overrides
    ov = arm_overrides(n4, "diloco", tmp_path)
    assert ov.index("model.hidden_size=48") < ov.index("model.num_layers=3")  # the user's own overrides come last
    tuned = CompareConfig(
        arms={"diloco": {"overrides": ["algorithm.outer_optimizer.lr=1.4"], "behind": "x.json: 2 tuning seeds"}}
    )
    ov = arm_overrides(tuned, "diloco", tmp_path)
    assert "algorithm.outer_optimizer.lr=1.4" in ov and "algorithm.outer_optimizer.lr=1.4" not in arm_overrides(
        tuned, "noloco", tmp_path
    )
    with pytest.raises(ValueError, match="arms"):
        CompareConfig(arms={"diloco": {"lr": 1.4}})


def test_the_reading_names_the_settings_and_seeds_before_any_number(tmp_path):
    _write(
        tmp_path / "ddp",
        [
            {"step": 20, "train/loss": 2.0, "time/train_s": 10.0, "comm/bytes_sent_total": 1e8},
            {"step": 20, "eval/loss": 2.5},
        ],
    )
    _write(
        tmp_path / "diloco",
        [
            {"step": 20, "train/loss": 2.6, "time/train_s": 12.0, "comm/bytes_sent_total": 4e6},
            {"step": 20, "eval/loss": 3.6},
        ],
    )
    cfg = CompareConfig(algorithms=["ddp", "diloco"], steps=20, inner_steps=10, preset="cpu_small")
    text = write_summary([read_arm(a, tmp_path / a) for a in cfg.algorithms], cfg, tmp_path)
    settings = text.split("\n\n")[1]
    assert settings.startswith(
        "Settings (preset cpu_small): ddp at conf/algorithm/ddp.yaml's defaults (no outer settings); "
        "diloco at conf/algorithm/diloco.yaml's defaults (untuned defaults, 1 seed)"
    )
    assert "decides nothing" in settings and "settings no benchmark tuned" in settings


def test_the_progress_line_follows_the_arm_and_returns_its_exit_code(tmp_path):
    import subprocess
    import sys

    from recipes.compare import MetricsTail, follow

    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    tail.poll()  # no file yet: nothing
    # a line still being written
    path.write_text(json.dumps({"step": 10, "train/loss": 3.0}) + "\n" + '{"step": 20, "ev')
    tail.poll()
    assert tail.step == 10 and tail.eval_loss is None
    with open(path, "a") as f:
        f.write('al/loss": 2.5}\n')
    tail.poll()
    assert tail.step == 20 and tail.eval_loss == 2.5
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert follow(proc, tail, "x", 20, every_s=0.05) == 3


def test_the_table_gives_bits_per_byte_and_the_text_names_the_corpus(tmp_path):
    corpus = {"name": "pinned", "hash": "ab" * 32, "note": None}
    for name, bpb in (("ddp", 2.5), ("diloco", 2.9)):
        _write(
            tmp_path / name,
            [
                {"step": 0, "corpus": corpus},
                {"step": 20, "train/loss": 2.0, "time/train_s": 10.0, "comm/bytes_sent_total": 1e8},
                {"step": 20, "eval/loss": 1.9, "eval/bpb": bpb},
            ],
        )
    cfg = CompareConfig(algorithms=["ddp", "diloco"], steps=20)
    text = write_summary([read_arm(a, tmp_path / a) for a in cfg.algorithms], cfg, tmp_path)
    assert "bits/byte" in text.splitlines()[0] and "2.900" in text
    assert f"Corpus: pinned {'ab' * 32}." in text
    _write(
        tmp_path / "other",
        [
            {"step": 0, "corpus": {"name": "offline", "hash": None, "note": "machine-dependent"}},
            {"step": 20, "train/loss": 2.0},
            {"step": 20, "eval/loss": 1.9},
        ],
    )
    text = write_summary([read_arm("ddp", tmp_path / "ddp"), read_arm("diloco", tmp_path / "other")], cfg, tmp_path)
    assert "The arms trained on different corpora" in text


def test_an_arm_that_syncs_every_step_is_known_by_its_class_not_its_name(tmp_path, monkeypatch):
    from decentrain.algorithms.base import ALGORITHMS, Algorithm

    every = type("EveryStep", (Algorithm,), {"syncs_every_step": True})
    monkeypatch.setitem(ALGORITHMS._entries, "allreduce", every)  # a second every-step algorithm, not named ddp
    cfg = CompareConfig(algorithms=["allreduce", "diloco"], inner_steps=10)
    assert not any(o.startswith("algorithm.inner_steps") for o in arm_overrides(cfg, "allreduce", tmp_path))
    assert "algorithm.inner_steps=10" in arm_overrides(cfg, "diloco", tmp_path)
    with pytest.raises(ValueError, match="algorithms='nope' is unknown"):  # before any arm trains
        CompareConfig(algorithms=["ddp", "nope"])


def test_an_arm_ends_by_its_result_file_not_by_its_log(tmp_path, monkeypatch, capsys):
    """run_arm reports what the arm's result.json says; a log that merely prints a done line is not a result."""
    import subprocess
    import sys

    import recipes.compare as compare

    popen = subprocess.Popen

    def fake_arm(writes_result: bool):
        # stands for `python -m recipes.train`: writes the arm's files, or only prints what a run would print
        arm = tmp_path / "ddp"
        record = {"line": "done: step 20, from the result file"}
        script = f"import json, pathlib; pathlib.Path({str(arm)!r}).mkdir(exist_ok=True); " + (
            f"pathlib.Path({str(arm / 'result.json')!r}).write_text(json.dumps({record!r}))"
            if writes_result
            else "print('[decentrain] done: step 20, from the log')"
        )
        return lambda argv, **kw: popen([sys.executable, "-c", script], **kw)

    cfg = CompareConfig(algorithms=["ddp"], steps=20)
    monkeypatch.setattr(compare.subprocess, "Popen", fake_arm(writes_result=True))
    compare.run_arm(cfg, "ddp", tmp_path)
    assert "[compare] ddp: done: step 20, from the result file (" in capsys.readouterr().out
    monkeypatch.setattr(compare.subprocess, "Popen", fake_arm(writes_result=False))
    with pytest.raises(SystemExit, match="exit 0 but no result.json"):  # the first run's result is not this one's
        compare.run_arm(cfg, "ddp", tmp_path)


def test_each_bench_preset_is_the_committed_record_s_winners():
    # a re-run that picks other winners must regenerate the preset (--preset-from), or compare would show
    # settings no record stands behind. Every N the record has decided has its preset, bench_n<N>
    import json

    import yaml

    from benchmarks.compressed_sync import compare_preset
    from benchmarks.record import RESULTS
    from recipes import conf_dir

    record = json.loads((RESULTS / "compressed_sync.json").read_text())
    ranks = sorted(c["ranks"] for c in record["figures"]["cells"].values())
    assert 2 in ranks
    for n in ranks:
        committed = yaml.safe_load((conf_dir() / "compare" / f"bench_n{n}.yaml").read_text())
        fresh = compare_preset(record, n)
        assert {k: v for k, v in committed.items() if k != "arms"} == {k: v for k, v in fresh.items() if k != "arms"}
        for arm, settings in fresh["arms"].items():
            assert committed["arms"][arm] == settings, (n, arm)
