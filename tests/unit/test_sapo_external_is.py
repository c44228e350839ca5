"""`loss.external_is`: peers' groups weighted by min(pi_old / mu_sender, C) per token (issue 30, item 3).

The sender attaches its sampling log-probs and tokenizer fingerprint; the receiver uses them only
where the fingerprint is its own and each completion re-tokenises to as many tokens, cut with the
text; anything else (NaN, inf, positive, wrong length, too many, a huge list, another tokenizer)
is dropped and counted, never raised out of a round, and the group trains uncorrected.
The feature is new: every test here fails on main (no `truncated_is_weight`, no "logprobs" field).
"""

import dataclasses
import json
import math
import time

import pytest
import torch

from decentrain.algorithms.sapo.batching import ScoredGroup, pad_sequences
from decentrain.algorithms.sapo.generation import completion_logprobs
from decentrain.algorithms.sapo.grpo import SAPOLossConfig, truncated_is_weight
from decentrain.algorithms.sapo.node import SAPONode, group_of
from decentrain.algorithms.sapo.offpolicy import check_logprobs
from decentrain.algorithms.sapo.payload import RolloutPayload, encode_payload
from decentrain.core.identity import NodeIdentity
from decentrain.testing import FixedExchange, tiny_sapo_config


def _cfg(external_is=True, cap=2.0, max_new_tokens=8):
    cfg = tiny_sapo_config(exchange="collective", num_local=0, num_external=1)
    cfg.loss.external_is, cfg.loss.external_is_cap = external_is, cap
    cfg.sampling.max_new_tokens = max_new_tokens
    return cfg


def _node(records=(), **kw) -> SAPONode:
    # node_index 0 for every node: the same seed, so the same initial weights on both sides
    return SAPONode(_cfg(**kw), 0, "node0", FixedExchange(list(records)))


def _teacher_logprobs(node, question, completions):
    """Log-probs of each completion's tokens under `node`'s policy (what the sender's sampler gives)."""
    enc = lambda t: node.tokenizer(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    pad = node.tokenizer.pad_token_id
    p_ids, p_mask = pad_sequences([enc(node.template(question))] * len(completions), pad, left=True)
    c_ids, c_mask = pad_sequences([enc(c) for c in completions], pad, left=False)
    with torch.no_grad():
        lp = completion_logprobs(node.model, p_ids, p_mask, c_ids, c_mask, 8, 1.0)
    return tuple(tuple(lp[i, : len(enc(c))].tolist()) for i, c in enumerate(completions))


def _wire(peer, group, tokenizer, round_=0, edit=None):
    """A signed payload of one group; `edit(obj)` changes the JSON before it is signed (hostile peers)."""
    data = encode_payload(
        RolloutPayload(peer.node_id, round_, time.time(), (group,), name="p", tokenizer=tokenizer), peer
    )
    if edit is None:
        return data
    obj = json.loads(data.split(b"\n", 1)[1])
    edit(obj)
    # NaN stays a NaN literal (not JSON); infinities are written as 1e999, which JSON parses to inf
    body = json.dumps(obj, separators=(",", ":"), allow_nan=True).encode().replace(b"Infinity", b"1e999")
    return b" ".join([b"DTR2", peer.node_id.encode(), peer.sign(body)]) + b"\n" + body


def _entry(node):
    return next(node.mixture[i] for i in range(50) if len(node.mixture[i].answer) >= 1)


def _receive(receiver, sender, completions, shift=0.0, tokenizer=None, edit=None):
    """`receiver` gets one group with `sender`'s log-probs of `completions` (minus `shift`)."""
    item = _entry(sender)
    lps = tuple(tuple(x - shift for x in lp) for lp in _teacher_logprobs(sender, item.question, completions))
    group = group_of(item, tuple(completions), lps)
    receiver.exchange.records = [
        ("p", _wire(NodeIdentity.generate(), group, tokenizer or sender.tokenizer_id, receiver.round, edit))
    ]
    receiver.budget.start_round()
    return receiver.share(receiver.round, [])


def _train(node, arrival, rewards=(1.0, 0.0, 0.0, 0.0)):
    return node.train_step([ScoredGroup(arrival.group, list(rewards), True, arrival.sender, arrival.sender_logprobs)])


COMPLETIONS = ("2\n", "13\n", "x7\n", "4\n")


def test_same_model_no_update_every_weight_is_one_and_the_loss_is_uncorrected():
    sender = _node()
    on, off = _node(), _node(external_is=False)
    arrival = _receive(on, sender, COMPLETIONS)[0]
    assert arrival.sender_logprobs is not None and all(lp is not None for lp in arrival.sender_logprobs)
    plain = _receive(off, sender, COMPLETIONS)[0]
    assert plain.sender_logprobs is None  # a receiver with it off uses none
    m_on, m_off = _train(on, arrival), _train(off, plain)
    assert m_on["is_tokens"] == sum(len(c) for c in COMPLETIONS)  # one byte a token
    assert m_on["is_weight_min"] == pytest.approx(1.0, abs=1e-5) and m_on["is_weight_max"] == pytest.approx(
        1.0, abs=1e-5
    )
    assert m_on["loss"] == pytest.approx(m_off["loss"], rel=1e-5, abs=1e-7)
    for a, b in zip(on.model.parameters(), off.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_a_sender_with_lower_logprobs_is_clamped_at_the_cap():
    sender = _node()
    on, off = _node(cap=1.5), _node(external_is=False)
    m_on = _train(on, _receive(on, sender, COMPLETIONS, shift=5.0)[0])  # pi/mu = e^5 > C everywhere
    m_off = _train(off, _receive(off, sender, COMPLETIONS)[0])
    assert m_on["is_weight_min"] == m_on["is_weight_max"] == 1.5 and m_on["is_capped"] == 1.0
    assert m_on["loss"] == pytest.approx(1.5 * m_off["loss"], rel=1e-5)


def test_the_real_sampler_sends_its_own_logprobs_and_the_same_model_weighs_them_one():
    sender = _node()
    sender.cfg.train.questions_per_round = 8
    groups = sender.generate(0)
    sent = [(c, lp) for g in groups for c, lp in zip(g.completions, g.logprobs) if lp]
    assert sent  # the tiny model's bytes are often not valid text, so some completions carry none
    receiver = _node()
    for g in groups:
        want = _teacher_logprobs(receiver, g.question, g.completions)
        for lp, w in zip(g.logprobs, want):
            if lp is not None:
                assert len(lp) == len(w)
                ratio = truncated_is_weight(torch.tensor(w), torch.tensor(lp), torch.ones(len(w)), 2.0)
                torch.testing.assert_close(ratio, torch.ones(len(w)), rtol=0, atol=1e-4)


def test_logprobs_are_cut_with_the_text():
    sender = _node()
    receiver = _node(max_new_tokens=3)  # and the stop string: "12\nJUNK" trains "12\n"
    full = _teacher_logprobs(sender, _entry(sender).question, ("12\nJUNK", "12345", "7\n", "8\n"))
    arrival = _receive(receiver, sender, ("12\nJUNK", "12345", "7\n", "8\n"))[0]
    assert arrival.group.completions == ("12\n", "123", "7\n", "8\n")
    assert arrival.sender_logprobs == tuple(tuple(round(x, 6) for x in lp[:3]) for lp in full)  # 6 decimals on the wire
    tb_rows = _train(receiver, arrival)["is_tokens"]
    assert tb_rows == 3 + 3 + 2 + 2


def _edit_logprobs(fn):
    def edit(obj):
        obj["groups"][0]["logprobs"] = fn(obj["groups"][0]["logprobs"])

    return edit


HOSTILE = {
    "nan": (_edit_logprobs(lambda lps: [[math.nan] * len(lps[0])] + lps[1:]), "payload:bad_json"),
    "+inf": (_edit_logprobs(lambda lps: [[math.inf] * len(lps[0])] + lps[1:]), "not_finite"),
    "-inf": (_edit_logprobs(lambda lps: [[-math.inf] + lps[0][1:]] + lps[1:]), "not_finite"),
    "positive": (_edit_logprobs(lambda lps: [[0.5] + lps[0][1:]] + lps[1:]), "positive"),
    "wrong_length": (_edit_logprobs(lambda lps: [lps[0] + [-1.0]] + lps[1:]), "token_count_mismatch"),
    "too_many": (_edit_logprobs(lambda lps: [[-1.0] * 600] + lps[1:]), "too_long"),
    "huge_list": (_edit_logprobs(lambda lps: [[-1.0] * 70_000] + lps[1:]), "payload:too_many_values"),
    "not_numbers": (_edit_logprobs(lambda lps: [[True] * len(lps[0])] + lps[1:]), "wrong_type"),
    "too_few_entries": (_edit_logprobs(lambda lps: lps[1:]), "wrong_type"),
    "a_string": (_edit_logprobs(lambda lps: "abc"), "wrong_type"),
    "bad_fingerprint": (lambda obj: obj.update(tokenizer=["x"]), "bad_tokenizer_id"),
}


@pytest.fixture(scope="module")
def receiver_and_sender():
    return _node(), _node()


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_logprobs_are_dropped_and_counted_and_never_raise(case, receiver_and_sender):
    receiver, sender = receiver_and_sender
    edit, reason = HOSTILE[case]
    item = _entry(sender)
    lps = _teacher_logprobs(sender, item.question, COMPLETIONS)
    receiver.exchange.records = [
        (
            "p",
            _wire(NodeIdentity.generate(), group_of(item, COMPLETIONS, lps), sender.tokenizer_id, receiver.round, edit),
        )
    ]
    metrics = receiver.run_round()  # never raises
    if reason.startswith("payload:"):  # not valid JSON, or over the value cap: the whole payload goes
        assert metrics[f"dropped/{reason[8:]}"] >= 1
    else:  # the group still arrives and trains, uncorrected
        assert metrics["external_received"] == 1
        assert metrics[f"dropped_logprobs/{reason}"] >= 1


def test_another_tokenizer_or_no_fingerprint_means_no_correction():
    sender = _node()
    receiver = _node()
    assert _receive(receiver, sender, COMPLETIONS, tokenizer="0123456789abcdef")[0].sender_logprobs is None
    assert receiver.logprob_drops["tokenizer_mismatch"] == 1

    def unsigned(obj):
        del obj["tokenizer"]

    assert _receive(receiver, sender, COMPLETIONS, edit=unsigned)[0].sender_logprobs is None
    assert receiver.logprob_drops["no_tokenizer"] == 1


def test_a_token_count_that_does_not_match_this_tokenizer_means_no_correction():
    # The sender's numbers are for "13\n" in its own tokens; here it is 3 bytes, and 2 were sent.
    sender, receiver = _node(), _node()
    arrival = _receive(receiver, sender, COMPLETIONS, edit=_edit_logprobs(lambda lps: [lps[0], lps[1][:2]] + lps[2:]))[
        0
    ]
    assert arrival.sender_logprobs is None and receiver.logprob_drops["token_count_mismatch"] == 1
    assert "is_tokens" not in _train(receiver, arrival)  # trained as without the option


def test_own_groups_are_unaffected():
    node = _node()
    node.cfg.train.questions_per_round = 1
    node.generate(0)
    own = node._local[0]
    metrics = node.train_step([ScoredGroup(own.group, [1.0, 0.0, 0.0, 0.0], False, None)])
    assert "is_tokens" not in metrics


def test_decoder_checks_each_value():
    assert check_logprobs([[-0.5, 0], None], 2, 4) == (((-0.5, 0.0), None), None)
    assert check_logprobs([[-0.5, math.nan], None], 2, 4) == (None, "not_finite")
    assert check_logprobs([[-math.inf], None], 2, 4) == (None, "not_finite")
    assert check_logprobs([[-1.0] * 5, None], 2, 4) == (None, "too_long")
    assert check_logprobs([[1e-9], None], 2, 4) == (None, "positive")
    assert check_logprobs({"a": 1}, 2, 4) == (None, "wrong_type")


@pytest.mark.parametrize("cap", [0.5, math.inf, math.nan, -1.0])
def test_a_bad_cap_is_a_config_error(cap):
    with pytest.raises(ValueError, match="external_is_cap"):
        SAPOLossConfig(num_generations=4, external_is=True, external_is_cap=cap)
    assert dataclasses.replace(SAPOLossConfig(num_generations=4), external_is_cap=1.0).external_is_cap == 1.0
