"""The optional sender log-probs of `loss.external_is`: their wire checks, the tokenizer
fingerprint a sender declares, and their alignment to the text a receiver trains.

A peer's numbers pick nothing but whether they are used: the receiver decides that the tokenizer
is shared from what it can check itself (the declared fingerprint equals its own AND every
completion re-tokenises here to as many tokens as log-probs were sent), then cuts them with the
text. Everything else drops them (counted by the node) and the group trains uncorrected.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Sequence

# Why a payload's or group's log-probs were not used (the groups still are); metric names.
LOGPROB_DROP_REASONS = (
    "bad_tokenizer_id",
    "wrong_type",
    "too_long",
    "not_finite",
    "positive",
    "no_tokenizer",
    "tokenizer_mismatch",
    "token_count_mismatch",
)


def check_logprobs(value: Any, num_generations: int, max_tokens: int) -> tuple[tuple | None, str | None]:
    """A group's "logprobs" field as (G entries, each a tuple of floats or None; None) or (None, reason).

    Each entry is null or a list of at most `max_tokens` numbers, each finite and <= 0 (a
    log-probability). Anything else drops the whole group's log-probs: a sender whose numbers are
    partly wrong is not trusted for the rest. Never raises.
    """
    if type(value) is not list or len(value) != num_generations:
        return None, "wrong_type"
    out: list[tuple[float, ...] | None] = []
    for entry in value:
        if entry is None:
            out.append(None)
            continue
        if type(entry) is not list:
            return None, "wrong_type"
        if len(entry) > max_tokens:
            return None, "too_long"
        if any(type(x) not in (int, float) for x in entry):  # exact: bool is an int subclass
            return None, "wrong_type"
        floats = tuple(float(x) for x in entry)
        if not all(math.isfinite(x) for x in floats):
            return None, "not_finite"
        if any(x > 0 for x in floats):
            return None, "positive"
        out.append(floats)
    return tuple(out), None


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """16 hex chars naming a tokenizer by what decides its token ids: class, vocabulary, special ids.

    A sender declares it beside its log-probs; a receiver uses them only when it equals its own
    and the completion also re-tokenises here to as many tokens as the sender sent log-probs.
    """
    vocab = sorted(tokenizer.get_vocab().items())
    specials = sorted((str(k), str(v)) for k, v in tokenizer.special_tokens_map.items())
    blob = json.dumps([type(tokenizer).__name__, vocab, specials], ensure_ascii=True)
    return hashlib.sha256(blob.encode("ascii")).hexdigest()[:16]


def align_logprobs(
    tokenizer: Any, sent: Sequence[str], cut: Sequence[str], logprobs: Sequence[tuple[float, ...] | None]
) -> tuple[tuple[float, ...] | None, ...] | None:
    """Per completion, the sender's log-probs of the tokens of `cut` (a prefix of `sent`, the text
    this node trains), or None for the whole group when a completion's text does not re-tokenise
    here to exactly as many tokens as log-probs were sent, or its cut to a prefix of them."""
    encode = lambda t: tokenizer(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    aligned: list[tuple[float, ...] | None] = []
    for text, kept_text, lp in zip(sent, cut, logprobs, strict=True):
        if lp is None:
            aligned.append(None)
            continue
        ids, kept = encode(text), encode(kept_text)
        if len(ids) != len(lp) or kept != ids[: len(kept)]:
            return None
        aligned.append(tuple(lp[: len(kept)]))
    return tuple(aligned)
