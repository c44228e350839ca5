"""Evaluate an HDEE ensemble: experts spread over ranks, per-token log-probs gathered and mixed.

Expert k lives on rank k % world_size (`ExpertPlacement`). Each rank scores every batch
with its own experts, `gather_expert_logprobs` assembles the [K, B, T] tensor on every
rank, and every rank mixes it identically, so the result does not depend on the world
size. The cached prior is fit per domain on that domain's validation split only.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import ByT5Tokenizer

from decentrain.algorithms.hdee.config import HdeeConfig, eval_domains
from decentrain.algorithms.hdee.mixing import CachedPrior, MixingConfig, mix
from decentrain.algorithms.hdee.train import model_dir
from decentrain.core.comm.ensemble import ExpertPlacement, gather_expert_logprobs, token_logprobs
from decentrain.core.world import World
from decentrain.data.blocks import build_corpus, encode
from decentrain.models.factory import build_model, build_tokenizer

PRIOR_SPLIT = "val"  # the only split the cached prior may see


@dataclass(frozen=True)
class ExpertRef:
    index: int
    name: str  # run name of the lane's final iteration
    path: Path


def expert_refs(cfg: HdeeConfig) -> list[ExpertRef]:
    """The ensemble's experts, one per lane; refuses before any work if a checkpoint is missing."""
    refs = [ExpertRef(i, n, model_dir(cfg.ensemble_dir, n)) for i, n in enumerate(cfg.plan.final_experts())]
    for ref in refs:
        if not (ref.path / "config.json").exists():
            raise FileNotFoundError(
                f"expert {ref.name} (lanes[{ref.index}]) has no checkpoint at {ref.path}; "
                f"train it with job.stage=lane job.index={ref.index}, or fix ensemble_dir={cfg.ensemble_dir!r}"
            )
    return refs


def tokenizer_fingerprint(tokenizer) -> str:
    """Two tokenizers encode alike iff class, vocabulary and special tokens agree."""
    vocab = sorted(tokenizer.get_vocab().items())
    specials = sorted((k, str(v)) for k, v in tokenizer.special_tokens_map.items())
    return hashlib.sha1(json.dumps([type(tokenizer).__name__, vocab, specials]).encode()).hexdigest()[:16]


def load_tokenizers(cfg: HdeeConfig, refs: list[ExpertRef]) -> list:
    """Each expert's saved tokenizer; mixed tokenizers are refused unless opted in, and then byte-level only."""
    toks = [build_tokenizer(dataclasses.replace(cfg.model, tokenizer=str(r.path))) for r in refs]
    prints = [tokenizer_fingerprint(t) for t in toks]
    if len(set(prints)) == 1:
        return toks
    first = refs[0]
    for ref, tok, fp in zip(refs, toks, prints):
        if fp == prints[0]:
            continue
        if not cfg.plan.per_expert_tokenization:
            raise ValueError(
                f"expert {ref.name} (lanes[{ref.index}]) has tokenizer {type(tok).__name__} (fingerprint {fp}), "
                f"unlike expert {first.name}'s ({prints[0]}); set plan.per_expert_tokenization=true to tokenise "
                "per expert and mix over a shared byte vocabulary"
            )
    for ref, tok in zip(refs, toks):
        # Mixing per position needs every expert's positions to be the same bytes.
        if not isinstance(tok, ByT5Tokenizer):
            raise ValueError(
                f"expert {ref.name} (lanes[{ref.index}]): plan.per_expert_tokenization mixes over a shared byte "
                f"vocabulary, but its tokenizer {type(tok).__name__} is not byte-level"
            )
    return toks


def load_local_experts(cfg: HdeeConfig, world: World, refs: list[ExpertRef]) -> dict[int, torch.nn.Module]:
    placement = ExpertPlacement(len(refs), world.world_size)
    models = {}
    for k in placement.experts_on(world.rank):
        model = build_model(dataclasses.replace(cfg.model, pretrained=str(refs[k].path)))
        models[k] = model.to(world.device).eval()
    return models


class EnsembleScorer:
    """Scores token blocks with every expert (spread over ranks) and mixes them with each weighting."""

    def __init__(self, cfg: HdeeConfig, world: World):
        self.cfg, self.world = cfg, world
        self.refs = expert_refs(cfg)
        self.tokenizers = load_tokenizers(cfg, self.refs)
        self.placement = ExpertPlacement(len(self.refs), world.world_size)
        self.models = load_local_experts(cfg, world, self.refs)

    @property
    def names(self) -> list[str]:
        return [r.name for r in self.refs]

    def logprobs(self, blocks: list[torch.Tensor]) -> torch.Tensor:
        """[K, B, T-1] log-probs; `blocks[k]` is the batch as expert k's tokenizer encodes it."""
        local = {k: token_logprobs(m, blocks[k].to(self.world.device)).cpu() for k, m in self.models.items()}
        return gather_expert_logprobs(self.world, self.placement, local).cpu()

    def fit_prior(self, val: list[torch.Tensor]) -> CachedPrior:
        c = self.cfg.eval
        prior = CachedPrior(len(self.refs), alpha=c.prior_alpha, max_sequences=c.prior_sequences)
        for batch in self.batches(val):
            if prior.full:
                break
            prior.update(self.logprobs(batch), split=PRIOR_SPLIT)
        return prior

    def score(self, batches: Iterable[list[torch.Tensor]], prior: CachedPrior | None) -> dict:
        """Perplexity of every weighting in `eval.weightings` and of each expert alone.

        Each batch holds one [B, T] tensor per expert (its own tokenisation of the same rows).
        """
        c = self.cfg.eval
        sums: dict[str, float] = defaultdict(float)
        tokens = 0
        for batch in batches:
            logp = self.logprobs(batch)
            tokens += logp[0].numel()
            for w in c.weightings:
                # top-k ranks the posterior under the cached prior when there is one
                log_prior = prior.log_prior() if w in ("cached", "topk") and prior is not None else None
                sums[w] += mix(logp, MixingConfig(name=w, top_k=c.top_k), log_prior).double().sum().item()
            for k, name in enumerate(self.names):
                sums[f"expert:{name}"] += logp[k].double().sum().item()
        ppl = {key: math.exp(-total / tokens) for key, total in sums.items()}
        return {
            "weightings": {w: ppl[w] for w in c.weightings},
            "experts": {n: ppl[f"expert:{n}"] for n in self.names},
            "tokens": tokens,
        }

    def batches(self, blocks: list[torch.Tensor]) -> Iterator[list[torch.Tensor]]:
        size = self.cfg.eval.batch_size
        for start in range(0, len(blocks[0]), size):
            yield [b[start : start + size] for b in blocks]

    def _needs_prior(self) -> bool:
        return any(w in ("cached", "topk") for w in self.cfg.eval.weightings)

    def evaluate(self, domains: list[str] | None = None) -> dict:
        """{domain: scores} on `eval.split` of each domain (the whole split, or eval.max_blocks)."""
        c = self.cfg.eval
        domains = domains or eval_domains(self.cfg)
        data = dataclasses.replace(self.cfg.data, domains=list(domains))
        corpora = {}  # one corpus per distinct tokenizer: experts that share one share the blocks
        for tok in self.tokenizers:
            corpora.setdefault(tokenizer_fingerprint(tok), build_corpus(data, tok))
        per_expert = [corpora[tokenizer_fingerprint(t)] for t in self.tokenizers]
        results = {}
        for domain in domains:
            split = [cp.split(c.split, domain)[: c.max_blocks] for cp in per_expert]
            prior = (
                self.fit_prior([cp.split(PRIOR_SPLIT, domain) for cp in per_expert]) if self._needs_prior() else None
            )
            results[domain] = self.score(self.batches(split), prior)
            if prior is not None:
                results[domain]["cached_prior"] = prior.log_prior().exp().tolist()
        return results

    def score_text(self, text: str, prior_domains: list[str] | None = None) -> dict:
        """Score a user's text: packed into `data.seq_len` blocks, each mixed as its own sequence."""
        seq = self.cfg.data.seq_len
        blocks, tails = [], []
        for tok in self.tokenizers:
            ids = torch.from_numpy(encode(tok, text))
            if len(ids) < 2:
                raise ValueError("the text is shorter than two tokens; nothing to score")
            n = len(ids) // seq
            blocks.append(ids[: n * seq].view(n, seq))
            tails.append(ids[n * seq :][None])  # the remainder, scored as one shorter sequence
        batches = list(self.batches(blocks)) if len(blocks[0]) else []
        if tails[0].shape[1] >= 2:
            batches.append(tails)
        prior = None
        if self._needs_prior():
            data = dataclasses.replace(self.cfg.data, domains=list(prior_domains or eval_domains(self.cfg)))
            vals: dict[str, torch.Tensor] = {}
            for tok in self.tokenizers:
                fp = tokenizer_fingerprint(tok)
                if fp not in vals:
                    corpus = build_corpus(data, tok)
                    vals[fp] = _interleave([corpus.split(PRIOR_SPLIT, d) for d in data.domains])
            prior = self.fit_prior([vals[tokenizer_fingerprint(t)] for t in self.tokenizers])
        return self.score(batches, prior)


def _interleave(parts: list[torch.Tensor]) -> torch.Tensor:
    """Round-robin rows across domains, so a prior capped at N sequences sees every domain."""
    rows = [p[i] for i in range(max(len(p) for p in parts)) for p in parts if i < len(p)]
    return torch.stack(rows)


def format_table(results: dict, weightings: list[str]) -> str:
    names = list(next(iter(results.values()))["experts"])
    head = f"{'domain':<16}" + "".join(f"{w:>10}" for w in weightings) + "".join(f"{n[:14]:>16}" for n in names)
    lines = [head, "-" * len(head)]
    for domain, r in results.items():
        lines.append(
            f"{domain:<16}"
            + "".join(f"{r['weightings'][w]:>10.3f}" for w in weightings)
            + "".join(f"{r['experts'][n]:>16.3f}" for n in names)
        )
    return "\n".join(lines)


def check_saved_plan(cfg: HdeeConfig, saved: HdeeConfig | None) -> None:
    """Refuse to evaluate `ensemble_dir` with a plan other than the one it was trained with."""
    if saved is not None and dataclasses.asdict(saved.plan) != dataclasses.asdict(cfg.plan):
        raise ValueError(
            f"ensemble_dir={cfg.ensemble_dir!r} was trained with another plan (its hdee.yaml); "
            "pass the same hdee_plan as for training, or another ensemble_dir"
        )
