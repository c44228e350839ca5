"""`decentrain experiment=diloco_cpu data=pinned` end to end on a small pinned corpus: it trains, and
names its text (the corpus hash) and its bits per byte in the metrics file and on the console."""

import pytest

from decentrain.data.prepare import prepare
from decentrain.testing import metrics, run_train
from decentrain.testing.pinned import tiny_config, tiny_domains, write_source

pytestmark = pytest.mark.integration


def test_diloco_on_the_pinned_corpus_reports_bits_per_byte_and_the_corpus_hash(tmp_path):
    manifest = prepare(tiny_config(tmp_path / "corpus"), tiny_domains(write_source(tmp_path)))
    run = tmp_path / "run"
    proc = run_train(
        run,
        "experiment=diloco_cpu",
        "data=pinned",
        f"data.pinned_dir={tmp_path / 'corpus'}",
        "data.domains=[alpha,beta]",
        "data.max_bytes_per_domain=null",
        "data.seq_len=32",
        "model.hidden_size=32",
        "model.num_layers=2",
        "model.num_heads=2",
        "model.intermediate_size=64",
        "launcher.nproc_per_node=2",
        "train.steps=4",
        "algorithm.inner_steps=2",
        "train.eval_every=2",
        "train.global_batch_size=8",
        "train.micro_batch_size=2",
        "train.checkpoint_every=100",
    )
    out = proc.stdout + proc.stderr
    assert f"corpus pinned {manifest['corpus_hash']}" in out and "bits per byte" in out
    rows = metrics(run)
    assert rows[0]["corpus"] == {"name": "pinned", "hash": manifest["corpus_hash"], "note": None}
    evals = [r for r in rows if "eval/bpb" in r]
    assert [r["step"] for r in evals] == [2, 4]
    assert all(0 < r["eval/bpb/alpha"] < 12 and 0 < r["eval/bpb/beta"] < 12 for r in evals)
