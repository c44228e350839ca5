"""The pinned corpus on a small pinned source set: bit-for-bit rebuilds, held-out text that never occurs in
train, verification that names the altered shard, resume, packs, and reading it for training."""

import http.server
import json
import math
import shutil
import threading

import numpy as np
import pytest
import torch
from transformers import ByT5Tokenizer

from decentrain.data import dedup
from decentrain.data.blocks import DataConfig, build_corpus, pack
from decentrain.data.pinned import CorpusError, corpus_hash, documents, verify
from decentrain.data.prepare import leak_report, main, prepare
from decentrain.data.sources import REGISTRIES, Source, SourceError, fetch, open_tree
from decentrain.testing.pinned import SHARED, tiny_config, tiny_domains, write_source


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pinned")
    source = write_source(tmp)
    manifest = prepare(tiny_config(tmp / "corpus"), tiny_domains(source))
    return tmp, source, manifest


def test_two_builds_give_the_same_corpus_hash_and_bytes(built, tmp_path):
    tmp, source, manifest = built
    again = prepare(tiny_config(tmp_path / "again"), tiny_domains(source))
    assert again["corpus_hash"] == manifest["corpus_hash"]
    for a, b in zip(manifest["shards"], again["shards"]):
        assert (tmp / "corpus" / a["path"]).read_bytes() == (tmp_path / "again" / b["path"]).read_bytes()


def test_duplicates_are_removed_and_held_out_text_never_occurs_in_train(built):
    tmp, _, manifest = built
    alpha, beta = manifest["domains"]["alpha"], manifest["domains"]["beta"]
    assert alpha["exact_duplicates"] == 1 and alpha["near_duplicates"] == 1
    assert all(manifest["domains"][d][f"{s}_bytes"] > 0 for d in ("alpha", "beta") for s in ("train", "val", "test"))
    assert beta["val_cut_rate"] + beta["test_cut_rate"] > 0  # the shared sentence was cut from held-out documents
    assert all(rate == 0 for rate in leak_report(tmp / "corpus").values())
    held = b"".join((tmp / "corpus" / s["path"]).read_bytes() for s in manifest["shards"] if s["split"] != "train")
    train = b"".join((tmp / "corpus" / s["path"]).read_bytes() for s in manifest["shards"] if s["split"] == "train")
    assert SHARED.encode() in train and SHARED.encode()[:64] not in held


def test_a_domain_short_of_held_out_text_after_the_cut_draws_more(built, tmp_path):
    import dataclasses

    tmp, source, manifest = built
    beta = manifest["domains"]["beta"]
    want = min(beta["val_bytes"], beta["test_bytes"]) + 1_000
    more = prepare(dataclasses.replace(tiny_config(tmp_path / "more"), min_heldout_bytes=want), tiny_domains(source))
    got = more["domains"]["beta"]
    assert got["heldout_scale"] > 1 and got["val_bytes"] >= want and got["test_bytes"] >= want
    assert got["train_bytes"] < beta["train_bytes"]  # what held-out gained, train gave
    assert all(rate == 0 for rate in leak_report(tmp_path / "more").values())


def test_without_the_cut_the_leak_is_found():
    """The check itself is not vacuous: a held-out stream that shares a sentence with train leaks."""
    train = dedup.join_docs([np.frombuffer(b"train text " * 10 + SHARED.encode(), np.uint8)])
    held = dedup.join_docs([np.frombuffer(b"held out text " * 10 + SHARED.encode(), np.uint8)])
    assert dedup.leak_rate(held, [train]) > 0
    cut, removed = dedup.cut_spans(held, dedup.hashes_in([train], np.unique(dedup.window_hashes(held)[0])), 16)
    assert removed >= len(SHARED) and dedup.leak_rate(cut, [train]) == 0


def _copy(tmp, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(tmp / "corpus", root, ignore=shutil.ignore_patterns(".work", ".sources"))
    return root


def test_an_altered_or_missing_shard_fails_in_one_line_naming_it(built, tmp_path, capsys):
    root = _copy(built[0], tmp_path)
    shard = root / "beta" / "train.000.bin"
    data = bytearray(shard.read_bytes())
    data[10] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(CorpusError, match="shard beta/train.000.bin: sha256 differs"):
        verify(root)
    assert main(["verify", "--dir", str(root)]) == 1
    err = capsys.readouterr().err.strip()
    assert "beta/train.000.bin" in err and len(err.splitlines()) == 1
    shard.unlink()
    with pytest.raises(CorpusError, match="shard beta/train.000.bin is missing"):
        verify(root)


def test_a_val_64gram_planted_in_train_fails_verify_leaks(built, tmp_path):
    """Even with hashes that match (a prepare that skipped the cut), `verify --leaks` finds held-out text in train."""
    root = _copy(built[0], tmp_path)
    manifest = json.loads((root / "manifest.json").read_text())
    val = (root / "alpha" / "val.000.bin").read_bytes()
    planted = val[200:300].replace(b"\0", b" ")
    shard = root / "alpha" / "train.000.bin"
    shard.write_bytes(shard.read_bytes() + planted + b"\0")
    for s in manifest["shards"]:  # re-hash, as a faulty pipeline would have published it
        if s["path"] == "alpha/train.000.bin":
            s["bytes"], s["sha256"] = shard.stat().st_size, __import__("hashlib").sha256(shard.read_bytes()).hexdigest()
    manifest["corpus_hash"] = corpus_hash(manifest["shards"])
    (root / "manifest.json").write_text(json.dumps(manifest))
    assert main(["verify", "--dir", str(root)]) == 0
    assert main(["verify", "--dir", str(root), "--leaks"]) == 1


def test_an_interrupted_prepare_resumes_from_the_extracted_domains(built, tmp_path, monkeypatch):
    import decentrain.data.prepare as prep

    tmp, source, manifest = built
    calls = []
    domains = tiny_domains(source)
    original = domains[1].extract

    def fails_once(trees):
        calls.append(1)
        if len(calls) == 1:
            raise KeyboardInterrupt  # the user's Ctrl-C in the second domain
        yield from original(trees)

    domains[1] = domains[1].__class__(domains[1].name, domains[1].sources, fails_once, domains[1].max_train_bytes)
    with pytest.raises(KeyboardInterrupt):
        prepare(tiny_config(tmp_path / "c"), domains)
    assert list((tmp_path / "c" / ".work").glob("alpha.*.json")) and not (tmp_path / "c" / "manifest.json").exists()
    opened = []
    monkeypatch.setattr(prep, "open_tree", lambda path: opened.append(path) or open_tree(path))
    assert prepare(tiny_config(tmp_path / "c"), domains)["corpus_hash"] == manifest["corpus_hash"]
    assert len(opened) == 1  # beta's package only: alpha's documents came from the work folder


def test_a_source_with_another_digest_or_no_longer_served_fails_with_its_name_and_version(tmp_path):
    real = write_source(tmp_path)
    wrong = Source("pkg", "1.0", "file", real.path, "0" * 64, real.size)
    with pytest.raises(SourceError, match="source pkg=1.0: pkg-1.0.tar.gz has sha256"):
        fetch(wrong, tmp_path / "cache")

    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    REGISTRIES["test"] = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        gone = Source("oldpkg", "2.0-1", "test", "pool/o/oldpkg_2.0-1_all.deb", "0" * 64, 1)
        with pytest.raises(SourceError, match=r"source oldpkg=2.0-1: the registry no longer serves it .*HTTP 404"):
            fetch(gone, tmp_path / "cache")
    finally:
        server.shutdown()
        del REGISTRIES["test"]


def test_a_pack_fits_its_cap_and_unpacks_to_a_verified_corpus(built, tmp_path):
    from decentrain.data.pinned import resolve_dir
    from decentrain.data.prepare import pack

    tmp, _, manifest = built
    archive = tmp_path / "gpu.tar.xz"
    sub = pack(tmp / "corpus", archive, max_mb=0.02)
    assert archive.stat().st_size <= 20_000 and sub["subset_of"] == manifest["corpus_hash"]
    root = resolve_dir(archive)  # a pack given as data.pinned_dir is unpacked beside itself
    assert verify(root)["corpus_hash"] == sub["corpus_hash"] != manifest["corpus_hash"]


def test_data_pinned_maps_the_same_blocks_as_packing_the_documents(built):
    tmp, _, manifest = built
    tok = ByT5Tokenizer()
    cfg = DataConfig(
        source="pinned",
        pinned_dir=str(tmp / "corpus"),
        domains=["alpha", "beta"],
        seq_len=32,
        max_bytes_per_domain=None,
        corpus_hash=manifest["corpus_hash"][:12],
    )
    corpus = build_corpus(cfg, tok)
    assert corpus.label == f"pinned {manifest['corpus_hash']}"
    assert corpus.identity == {"name": "pinned", "hash": manifest["corpus_hash"], "note": None}
    stream = np.fromfile(tmp / "corpus" / "alpha" / "train.000.bin", dtype=np.uint8)
    expected = pack(documents(stream, None), tok, 32)
    got = corpus.split("train", "alpha")
    assert len(got) == len(expected) and torch.equal(got[torch.arange(len(got))], expected)
    train = corpus.train_blocks()
    n_alpha = len(got)
    assert torch.equal(train[torch.tensor([0, n_alpha])], torch.stack([expected[0], corpus.split("train", "beta")[0]]))
    with pytest.raises(ValueError, match="data.corpus_hash=deadbeef"):
        build_corpus(DataConfig(**{**cfg.__dict__, "corpus_hash": "deadbeef"}), tok)


def test_bits_per_byte_of_byte_tokens_is_the_loss_in_bits_without_eos():
    from decentrain.algorithms.pretraining.trainer import evaluate_bits
    from decentrain.data.blocks import token_byte_lengths
    from decentrain.models.factory import ModelConfig, build_model

    tok = ByT5Tokenizer()
    model = build_model(
        ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_seq_len=64), tok
    )
    blocks = {"d": torch.randint(3, 259, (4, 16))}
    loss, bpb = evaluate_bits(model, blocks, 2, torch.device("cpu"), token_bytes=token_byte_lengths(tok))
    assert bpb["d"] == pytest.approx(loss["d"] / math.log(2), rel=1e-5)
    blocks["d"][:, 8] = tok.eos_token_id  # EOS is no text: it leaves the byte count
    loss, bpb = evaluate_bits(model, blocks, 2, torch.device("cpu"), token_bytes=token_byte_lengths(tok))
    assert bpb["d"] != pytest.approx(loss["d"] / math.log(2), rel=1e-5)


def test_html_becomes_readable_text_without_scripts_menus_or_markup():
    pytest.importorskip("inscriptis")
    from decentrain.data.pinned_domains import html_text

    page = (
        b"<html><head><title>t</title><script>var x = 1;</script></head><body><nav>Home | Next</nav>"
        b"<div role='main'><h1>contextvars</h1><p>This module provides <code>ContextVar</code> objects.</p>"
        b"<pre>var: ContextVar[int] = ContextVar('var', default=42)</pre></div></body></html>"
    )
    text = html_text(page)
    assert "This module provides ContextVar objects." in text and "default=42" in text
    assert "var x = 1" not in text and "Home | Next" not in text and "<" not in text
    assert html_text(b"") == ""


def test_a_wordnet_synset_line_becomes_lemmas_and_gloss():
    from decentrain.data.pinned_domains import wordnet_line

    line = (
        "00001930 03 n 02 physical_entity 0 thing(a) 1 007 @ 00001740 n 0000 ~ 00002452 n 0000 "
        "| an entity that has physical existence  "
    )
    assert wordnet_line(line) == "physical entity, thing (noun): an entity that has physical existence"
    assert wordnet_line("  1 This software and database is being provided") is None
    assert wordnet_line("garbage | without fields") is None
