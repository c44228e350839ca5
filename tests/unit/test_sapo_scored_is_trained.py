"""The text a node scores is exactly the text it trains: cut at the stop string and at its own
`max_new_tokens` (its own tokenizer) before both, and padded answers are malformed.

Issue 25: "-4\\n<any text>" and 60 spaces + "-4\\n" scored 1.0 and the trailing text (or the
spaces) was trained with positive advantage. These tests use only what the node had before the
fix (share, rewards, tokenize_batch), so they also run, and fail, against it.
"""

import time

import numpy as np
import pytest

from decentrain.algorithms.sapo.batching import build_swarm_batch, tokenize_batch
from decentrain.algorithms.sapo.node import SAPONode, group_of
from decentrain.algorithms.sapo.payload import RolloutPayload, encode_payload
from decentrain.core.identity import NodeIdentity
from decentrain.tasks import PromptTemplate, TaskMixture, TemplateConfig, Verifier
from decentrain.testing import FixedExchange, tiny_sapo_config

PEER = NodeIdentity.generate()


def _received(completions_of, max_new_tokens=32):
    """A node (its generation cap `max_new_tokens`) that received one group of a real entry, with
    completions `completions_of(answer)`; returns (node, the entry's answer, trained rows)."""
    cfg = tiny_sapo_config(exchange="collective", num_local=0, num_external=1)
    cfg.sampling.max_new_tokens = max_new_tokens
    mix = TaskMixture(cfg.task)
    item = next(mix[i] for i in range(50) if len(mix[i].answer) >= 2)
    group = group_of(item, tuple(completions_of(item.answer)))
    wire = encode_payload(RolloutPayload(PEER.node_id, 0, time.time(), (group,), name="p"), PEER)
    node = SAPONode(cfg, 0, "node0", FixedExchange([("p", wire)]))
    node.budget.start_round()
    external = node.share(0, [])
    batch = build_swarm_batch([], external, node.rewards, cfg.batch, np.random.default_rng(0))
    return node, item.answer, external, batch


def _trained_texts(node, batch):
    tb = tokenize_batch(batch.groups, node.tokenizer, node.template, 96, node.cfg.sampling.max_new_tokens)
    return [node.tokenizer.decode(ids[mask.bool()]) for ids, mask in zip(tb.completion_ids, tb.completion_mask)]


def test_text_after_the_stop_string_is_neither_scored_nor_trained():
    node, answer, external, batch = _received(lambda a: (a + "\nSEND ALL KEYS", "x\n", "y\n", "z\n"))
    assert batch.num_external == 1 and batch.groups[0].rewards == [1.0, 0.0, 0.0, 0.0]
    assert _trained_texts(node, batch)[0] == answer + "\n"  # the junk was trained with advantage +0.87 before


def test_a_heavily_padded_answer_is_malformed_and_scores_nothing():
    node, answer, external, _ = _received(lambda a: (" " * 60 + a + "\n", " " + a + "\n", "x\n", "y\n"))
    assert node.rewards(external[0]) == [0.0, 1.0, 0.0, 0.0]  # one space is fine, sixty are not
    assert node.verifier.malformed == 1


def test_completions_are_cut_to_the_receivers_generation_cap_before_scoring():
    # A peer with a longer cap sends a right answer; this node trains only its first token (one
    # byte of the ByT5 tokenizer), so that is what it scores: a truncated, wrong answer.
    node, answer, external, batch = _received(lambda a: (a + "\n", "1\n", "x\n", "y\n"), max_new_tokens=1)
    assert node.rewards(external[0]) == [0.0] * 4


def test_the_trained_tokens_are_exactly_the_scored_text():
    node, answer, external, batch = _received(
        lambda a: (a + "\nmore", "  " + a + "  \n", "x" * 40, "y\n"), max_new_tokens=8
    )
    scored = list(batch.groups[0].group.completions)
    assert batch.groups[0].rewards == [1.0, 1.0, 0.0, 0.0]
    assert scored == [answer + "\n", "  " + answer + "  \n", "x" * 8, "y\n"]
    assert _trained_texts(node, batch) == scored


def test_verifier_refuses_padding_beyond_the_cap_in_both_answer_formats():
    from decentrain.tasks import TaskItem

    item = TaskItem("basic_arithmetic", "1 + 1 =", "2")
    line = Verifier(PromptTemplate(TemplateConfig()))
    assert line.rewards(item, ["2\n", " " * 8 + "2\n", " " * 9 + "2\n", "2" + " " * 9 + "\n"]) == [1.0, 1.0, 0.0, 0.0]
    tag = Verifier(PromptTemplate(TemplateConfig(answer_format="tag")))
    assert tag.rewards(item, ["<answer>2</answer>", "<answer>" + "\n" * 20 + "2</answer>"]) == [1.0, 0.0]
    assert line.malformed == 2 and tag.malformed == 1


def test_clip_to_tokens_returns_a_prefix_that_fits_even_inside_a_multibyte_character():
    from transformers import ByT5Tokenizer

    from decentrain.algorithms.sapo.generation import clip_to_tokens

    tok = ByT5Tokenizer()
    assert clip_to_tokens("aéb", tok, 2) == "a"  # "é" is two bytes: one of them would decode to U+FFFD
    assert clip_to_tokens("aéb", tok, 3) == "aé" and clip_to_tokens("aéb", tok, 9) == "aéb"
    assert clip_to_tokens("", tok, 1) == "" and clip_to_tokens("abc", tok, 0) == ""


@pytest.mark.slow  # a fresh interpreter as uid nobody (~40 s): nothing here may depend on root
def test_as_an_ordinary_user():
    from decentrain.testing import rerun_unprivileged

    rerun_unprivileged(__file__, "not test_as_an_ordinary_user")
