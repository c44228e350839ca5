"""A DEI node survives any model endpoint: each hostile answer is one counted, logged failed call
under one deadline for the whole call, the key goes to no other host, and a node keeps every
finished round's archive and champion.

Each endpoint is a real server on loopback writing raw bytes (`HostileEndpoint`). On main at
78c329b, the first four attacks raised `http.client.HTTPException` out of the operator, `[` x
32000 raised RecursionError, the drip and the endless trailer held the call until the endpoint
gave up (60 s at `timeout_s=1`), a 30x sent the Authorization key to the host it named, and
archive.json was written only after the last round. Runs as root and, re-run by
`test_as_an_ordinary_user`, as uid nobody.
"""

from __future__ import annotations

import json
import logging
import time

import numpy as np
import pytest
import torch

from decentrain.algorithms.dei.config import DEIConfig, SearchConfig
from decentrain.algorithms.dei.node import DEINode
from decentrain.algorithms.dei.operators import BudgetedOperator, OperatorConfig, Request, build_operator
from decentrain.algorithms.dei.pmars import PMarsConfig, PMarsUnavailable, find_pmars
from decentrain.algorithms.dei.redcode import parse
from decentrain.algorithms.dei.sft import shipped_warriors
from decentrain.testing import pmars_or_skip, rerun_unprivileged
from decentrain.testing.dei import HostileEndpoint, chat_answer, drip, endless_trailer, ok, send

KEY = "sk-dei-test-0123456789abcdef"
TIMEOUT_S = 1.0
SLACK_S = 15.0  # the deadline is exact; this only absorbs a loaded machine's scheduling
WARRIOR = "```redcode\nMOV.I $0, $1\n```"

ATTACKS = {
    "too_many_headers": (send(b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 101 + b"\r\n"), "protocol"),
    "header_line_70kb": (send(b"HTTP/1.1 200 OK\r\nX-A: " + b"a" * 70_000 + b"\r\n\r\n"), "protocol"),
    "garbage_status_line": (send(b"SSH-2.0-OpenSSH_9.6\r\n\r\n"), "protocol"),
    "bad_chunk_size": (send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"), "protocol"),
    "json_nested_32000_deep": (send(ok(b"[" * 32_000)), "not_an_answer"),
    "not_json": (send(ok(b"<html>busy</html>")), "not_an_answer"),
    "answer_over_32kb": (send(chat_answer("x" * 40_000)), "too_large"),
    "server_error": (send(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"), "http_status"),
    "hangs_up": (send(b""), "connection"),
    "drip_a_byte_every_0.2s": (drip(chat_answer(WARRIOR)), "deadline"),
    "endless_chunked_trailer": (endless_trailer(), "deadline"),
}


@pytest.fixture
def key(monkeypatch):
    monkeypatch.setenv("DEI_TEST_KEY", KEY)
    return "DEI_TEST_KEY"


def _operator(url: str, key_env: str, calls: int = 1) -> BudgetedOperator:
    cfg = OperatorConfig(name="openai", base_url=url, api_key_env=key_env, timeout_s=TIMEOUT_S)
    return build_operator(cfg, calls, torch.device("cpu"), seed=0)


def _timed_call(op: BudgetedOperator) -> tuple[list[str | None], float]:
    start = time.monotonic()
    answers = op.generate([Request(None)], np.random.default_rng(0))
    return answers, time.monotonic() - start


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_hostile_answer_is_one_counted_logged_failed_call(attack, key, caplog):
    respond, reason = ATTACKS[attack]
    endpoint = HostileEndpoint(respond)
    try:
        op = _operator(endpoint.url(), key)
        with caplog.at_level(logging.WARNING, logger="decentrain.algorithms.dei"):
            answers, elapsed = _timed_call(op)
    finally:
        endpoint.close()
    assert elapsed < TIMEOUT_S + SLACK_S, f"the call took {elapsed:.1f} s under a {TIMEOUT_S} s deadline"
    assert answers == [None]
    assert (op.used, op.failed, dict(op.failure_counts())) == (1, 1, {reason: 1})
    assert f"call failed: {reason}" in caplog.text and KEY not in caplog.text
    assert f"Bearer {KEY}" in endpoint.heads[0]  # the configured host, and only it, gets the key


def test_a_good_answer_is_its_text(key):
    endpoint = HostileEndpoint(send(chat_answer(WARRIOR)))
    try:
        op = _operator(endpoint.url(), key)
        answers, _ = _timed_call(op)
    finally:
        endpoint.close()
    assert answers == [WARRIOR]
    assert endpoint.heads[0].startswith("POST /v1/chat/completions ")


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_refused_and_the_key_goes_nowhere_else(status, key):
    elsewhere = HostileEndpoint(send(chat_answer(WARRIOR)))
    location = f"http://127.0.0.1:{elsewhere.port}/v1/chat/completions"
    origin = HostileEndpoint(
        send(f"HTTP/1.1 {status} Moved\r\nLocation: {location}\r\nContent-Length: 0\r\n\r\n".encode())
    )
    try:
        op = _operator(origin.url(), key)
        answers, _ = _timed_call(op)
    finally:
        origin.close()
        elsewhere.close()
    # the call has returned: a followed redirect would already have reached `elsewhere`
    assert not any(KEY in head for head in elsewhere.heads), elsewhere.heads
    assert elsewhere.heads == []
    assert answers == [None] and dict(op.failure_counts()) == {"redirect_refused": 1}


def _cfg(tmp_path, rounds: int = 2) -> DEIConfig:
    return DEIConfig(
        num_nodes=1,
        search=SearchConfig(rounds=rounds, n_init=2, iters=2),
        pmars=PMarsConfig(rounds=4),
        run_dir=str(tmp_path),
    )


def _rows(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (tmp_path / "node0" / "metrics.jsonl").read_text().splitlines()]


def test_a_node_finishes_its_run_against_an_endpoint_that_fails_every_call(tmp_path, key):
    endpoint = HostileEndpoint(send(b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 101 + b"\r\n"))
    cfg = _cfg(tmp_path)
    try:
        op = _operator(endpoint.url(), key, calls=cfg.search.budget)
        history = DEINode(cfg, 0, op, None, tmp_path).run()
    finally:
        endpoint.close()
    assert [r["round"] for r in history] == [0, 1] and _rows(tmp_path) == history
    assert history[-1]["calls_used"] == history[-1]["calls_failed"] == 2 * (2 + 2)
    assert history[-1]["call_failed/protocol"] == 8
    assert json.loads((tmp_path / "node0" / "archive.json").read_text())["rounds"] == [[], []]


class Raising:
    """An operator whose every call raises, as a local model stack can (out of memory, a CUDA error)."""

    def generate(self, requests, rng):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_an_operator_that_raises_costs_the_node_its_calls_not_the_run(tmp_path, caplog):
    cfg = _cfg(tmp_path)
    with caplog.at_level(logging.WARNING, logger="decentrain.algorithms.dei"):
        history = DEINode(cfg, 0, BudgetedOperator(Raising(), cfg.search.budget), None, tmp_path).run()
    assert [r["round"] for r in history] == [0, 1]
    assert history[-1]["calls_failed"] == history[-1]["call_failed/raised/RuntimeError"] == 8
    assert "Raising failed on 1 call(s): RuntimeError" in caplog.text


class Killed(BaseException):
    """The node's process dying mid-round (what no handler may swallow)."""


class ShippedThenKilled:
    """Answers with shipped warriors for `calls` calls (round 0), then the node dies."""

    def __init__(self, calls: int):
        self.texts = [w.render() for w in shipped_warriors().values()]
        self.left = calls

    def generate(self, requests, rng):
        if self.left <= 0:
            raise Killed
        self.left -= len(requests)
        return [self.texts[int(rng.integers(len(self.texts)))] for _ in requests]


def test_a_node_that_dies_keeps_every_finished_rounds_archive_and_champion(tmp_path):
    pmars_or_skip()
    cfg = _cfg(tmp_path, rounds=3)
    node = DEINode(cfg, 0, BudgetedOperator(ShippedThenKilled(2 + 2), cfg.search.budget), None, tmp_path)
    with pytest.raises(Killed):
        node.run()
    saved = json.loads((tmp_path / "node0" / "archive.json").read_text())
    assert len(saved["rounds"]) == 1 and saved["rounds"][0], saved  # round 0's elites, saved before round 1
    champion = (tmp_path / "node0" / "round_000_champion.red").read_text()
    assert parse(champion, cfg.redcode).warrior is not None
    assert [r["round"] for r in _rows(tmp_path)] == [0]
    assert not list((tmp_path / "node0").glob("*.tmp"))  # written whole, then renamed


def test_as_an_ordinary_user(monkeypatch):
    selector = "hostile_answer or good_answer or redirect or fails_every_call or raises"
    try:
        monkeypatch.setenv("DECENTRAIN_PMARS", find_pmars(PMarsConfig()))
        selector += " or dies_keeps"
    except PMarsUnavailable:  # no pMARS here: the battle-free tests still run as nobody
        pass
    rerun_unprivileged(__file__, selector)
