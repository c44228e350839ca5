"""The one training loop every pre-training algorithm shares.

It knows nothing of DDP, DiLoCo or NoLoCo: the `Algorithm` hooks (wrap_model, no_sync,
after_optimizer_step, state) carry all of that, so the loop stays an ordinary
AdamW loop with gradient accumulation, evaluation and exact-resume checkpoints.
The backward and optimizer step go through an inner `Engine` (plain torch, or
DeepSpeed ZeRO inside each replica), picked by `engine.name`.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from decentrain.algorithms.base import Algorithm
from decentrain.algorithms.pretraining.config import LoopConfig
from decentrain.algorithms.pretraining.engines import ENGINES, EngineConfig, OptimConfig, build_optimizer  # noqa: F401 (re-exported)
from decentrain.algorithms.pretraining.precision import (
    apply_compile,
    autocast,
    resolve_precision,
    set_tf32,
    weight_dtype,
)
from decentrain.core.checkpoint import Checkpointer
from decentrain.core.mesh import ReplicaLayout, replica_layout
from decentrain.core.metrics import (
    CommMeter,
    LoggerConfig,
    MetricsLogger,
    Throughput,
    accumulate_metrics,
    flops_per_token,
    peak_flops,
)
from decentrain.core.world import World
from decentrain.data.blocks import Corpus, ShardedSampler


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state(device: torch.device) -> dict:
    """Every RNG a step may draw from: CPU torch, Python, and on CUDA the device's own generator."""
    state = {"torch": torch.get_rng_state(), "python": list(random.getstate()[1]), "python_pos": random.getstate()[2]}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate((3, tuple(state["python"]), state["python_pos"]))
    if device.type == "cuda" and "cuda" in state:  # a checkpoint written on CPU has none: CUDA keeps its seed
        torch.cuda.set_rng_state(state["cuda"], device)


@torch.no_grad()
def evaluate_bits(
    model: torch.nn.Module,
    blocks: dict[str, torch.Tensor],
    micro_batch: int,
    device: torch.device,
    precision: str = "fp32",
    token_bytes: torch.Tensor | None = None,
) -> tuple[dict[str, float], dict[str, float]]:
    """Mean next-token loss per domain (nats per token) and, given the bytes each token id stands for,
    bits per byte per domain: the summed NLL of the tokens that are text / ln 2 / their bytes (nanochat's
    rule; the EOS between documents is no text). This replica only: evaluation never communicates.

    Sums accumulate on the device; the host reads them once, at the end.
    """
    was_training = model.training
    model.eval()
    means, bits = [], []
    for data in blocks.values():
        total = torch.zeros((), dtype=torch.float32, device=device)
        nll_bits = torch.zeros((), dtype=torch.float64, device=device)
        n_bytes = torch.zeros((), dtype=torch.float64, device=device)
        batches = data.split(micro_batch)
        for b in batches:
            b = b.to(device, non_blocking=True)
            with autocast(precision, device):
                out = model(input_ids=b, labels=b, use_cache=False)
            total += out.loss.float()
            if token_bytes is not None:
                target = b[:, 1:]
                nll = torch.nn.functional.cross_entropy(
                    out.logits[:, :-1].float().flatten(0, 1), target.flatten(), reduction="none"
                )
                size = token_bytes[target.flatten()]
                nll_bits += (nll * (size > 0)).sum().double() / math.log(2)
                n_bytes += size.sum().double()
        means.append(total / max(1, len(batches)))
        bits.append(nll_bits / n_bytes.clamp(min=1))
    model.train(was_training)
    values = torch.stack(means).tolist() if means else []
    bpb = torch.stack(bits).tolist() if bits and token_bytes is not None else []
    return dict(zip(blocks, values)), dict(zip(blocks, bpb))


def evaluate(
    model: torch.nn.Module,
    blocks: dict[str, torch.Tensor],
    micro_batch: int,
    device: torch.device,
    precision: str = "fp32",
) -> dict[str, float]:
    """Mean next-token loss per domain (evaluate_bits without the bytes)."""
    return evaluate_bits(model, blocks, micro_batch, device, precision)[0]


def eval_metrics(loss: dict[str, float], bpb: dict[str, float]) -> dict[str, float]:
    """The eval line of the metrics log: mean loss and bits per byte over the domains, and each domain's."""
    out = {"eval/loss": float(np.mean(list(loss.values()))), **{f"eval/{d}": v for d, v in loss.items()}}
    if bpb:
        out |= {"eval/bpb": float(np.mean(list(bpb.values()))), **{f"eval/bpb/{d}": v for d, v in bpb.items()}}
    return out


def model_flops_per_token(model: torch.nn.Module, seq_len: int) -> float:
    """core.metrics.flops_per_token for a transformers causal LM (embedding table excluded)."""
    params = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if emb is not None and not (out is not None and out.weight is emb.weight):
        params -= emb.weight.numel()  # a tied table is the LM head's matmul too: keep it counted
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", 0)
    hidden = getattr(config, "hidden_size", 0)
    return flops_per_token(params, layers, hidden, seq_len)


@dataclass
class TrainResult:
    final_step: int
    train_loss: float
    eval_loss: dict[str, float]
    seconds: float
    bytes_sent: int | None = None  # this replica's, over the whole run (resumed runs included); None: unknown
    eval_bpb: dict[str, float] = field(
        default_factory=dict
    )  # bits per byte per domain (empty: the corpus has no byte counts)


class Trainer:
    """The loop over one run's steps, configured by its own sections: `train` (the loop),
    `engine` and `optim` (handed to the engine), `logger` (log interval, peak FLOP/s)."""

    def __init__(
        self,
        loop: LoopConfig,
        world: World,
        algorithm: Algorithm,
        model: torch.nn.Module,
        corpus: Corpus,
        run_dir: Path,
        layout: ReplicaLayout | None = None,
        *,
        engine: EngineConfig | None = None,
        optim: OptimConfig | None = None,
        logger: LoggerConfig | None = None,
        resume: bool = True,
        sampler: Callable[[int], ShardedSampler] | None = None,
    ):
        engine, optim, self.logger_cfg = (
            ENGINES.config(engine or EngineConfig()),
            optim or OptimConfig(),
            logger or LoggerConfig(),
        )
        self.loop, self.world, self.algorithm, self.resume = loop, world, algorithm, resume
        self.run_dir = run_dir
        self.precision = resolve_precision(loop.precision, world.device)
        set_tf32(world.device, loop.tf32)
        # fp32 master weights unless pure bf16 was chosen (model.dtype only sets how it was built/loaded)
        self.model = model.to(device=world.device, dtype=weight_dtype(self.precision))
        self.train_blocks = corpus.train_blocks()
        n_eval = loop.eval_batches * loop.micro_batch_size
        # evaluation data lives on the device for the whole run (small: eval_batches micro-batches per domain)
        self.val_blocks = {d: corpus.split("val", d)[:n_eval].to(world.device) for d in corpus.blocks}
        self.token_bytes = None if corpus.token_bytes is None else corpus.token_bytes.to(world.device)
        # the batch order over the training blocks: each rank its slice of one seeded order, unless the transport
        # gives its own (torchft's replica groups each read their own slice: TransportSpec.sampler)
        n = len(self.train_blocks)
        self.sampler = (
            sampler(n)
            if sampler
            else ShardedSampler(n, loop.global_batch_size, world.rank, world.world_size, loop.seed)
        )
        self.accum = loop.global_batch_size // (world.world_size * loop.micro_batch_size)
        layout = layout or replica_layout(world, 1)
        self.engine = ENGINES.get(engine.name)(engine, optim, loop, layout, self.model, self.accum)
        self.engine.checkpoint_dir = run_dir / "checkpoints"
        self.checkpointer = Checkpointer(
            run_dir / "checkpoints", world.rank, world.world_size, keep=loop.keep_checkpoints
        )
        self.step = 0
        self.step_times: list[float] = []
        self.bytes_meter = CommMeter()
        seq = self.train_blocks.shape[1]
        tokens_rank = loop.global_batch_size // world.world_size * seq
        name = torch.cuda.get_device_name(world.device) if world.device.type == "cuda" else ""
        self.throughput = Throughput(
            tokens_rank,
            loop.global_batch_size * seq,
            model_flops_per_token(self.model, seq),
            peak_flops(name, self.logger_cfg.peak_flops),
            world.device,
            device_share=world.device_share,
        )
        if loop.compile == "blocks":  # in place, after the optimizer saw the parameters, before wrapping (torchtitan)
            apply_compile(self.model, "blocks")

    def compile_wrapped(self, model: torch.nn.Module) -> None:
        """`compile=model` compiles the module the loop calls, after wrapping: compiling DDP itself lets
        dynamo split the graph at its buckets, so the all-reduce overlaps the backward. Evaluation
        then calls the bare module eagerly (compiling it too would nest one compile in the other)."""
        if self.loop.compile == "model":
            apply_compile(model, "model")

    # -- checkpoint state -------------------------------------------------------------
    def state_dict(self) -> dict:
        return {
            **({"model": self.model.state_dict()} if self.engine.whole_model_state else {}),
            **self.engine.state_dict(),  # torch: "optimizer" and "scheduler"
            "sampler": self.sampler.state_dict(),
            "algorithm": self.algorithm.state_dict(),
            "rng": rng_state(self.world.device),
            "comm_bytes": self.bytes_meter.total,
        }

    def load_state_dict(self, state: dict) -> None:
        if self.engine.whole_model_state:
            self.model.load_state_dict(state["model"])
        self.engine.load_state_dict(state)
        self.sampler.load_state_dict(state["sampler"])
        self.algorithm.load_state_dict(state["algorithm"])
        set_rng_state(state["rng"], self.world.device)
        self.bytes_meter.total = int(state.get("comm_bytes", 0))  # older checkpoints: counted from here

    def heal_state(self) -> dict:
        """What a replacement pulls from a live peer: all of state_dict but the RNG (each rank keeps its own)."""
        return {"step": self.step, **{k: v for k, v in self.state_dict().items() if k != "rng"}}

    def load_heal_state(self, state: dict) -> None:
        self.load_state_dict({**state, "rng": self.state_dict()["rng"]})
        self.step = int(state["step"])

    def maybe_resume(self) -> int | None:
        # the newest step intact on every rank (damaged ones are skipped with a warning); a
        # replacement (incarnation > 0) heals from a live peer instead: agreeing is a world collective
        step = self.checkpointer.agree_resume_step(self.world) if self.resume and not self.world.incarnation else None
        if step is not None:
            self.load_state_dict(self.checkpointer.load(step))
            self.step = step
        return step

    def save(self) -> None:
        names, params = zip(*self.engine.outer_model.named_parameters())  # a sharded engine: this rank's shards
        finite = torch.stack([torch.isfinite(p).all() for p in params]).tolist()  # one host read
        bad = [n for n, ok in zip(names, finite) if not ok]
        if not self.engine.all_ranks_agree(not bad):  # never let a NaN model replace the last good checkpoint
            where = f"in {bad[:3]}" if bad else "on another rank of this replica"
            raise FloatingPointError(
                f"step {self.step}: non-finite weights {where}; stopping without saving, "
                f"the last good checkpoint is kept ({self.checkpointer.root})"
            )
        self.engine.save_sharded(self.step)  # first: a complete per-rank checkpoint implies the sharded one
        self.checkpointer.save(self.step, {"step": self.step, **self.state_dict()})

    def check_finite_loss(self, loss: float) -> None:
        if not math.isfinite(loss):
            raise FloatingPointError(
                f"step {self.step}: train loss is {loss}; stopping without saving, the last good "
                f"checkpoint is kept ({self.checkpointer.root}). Lower optim.lr or check the data"
            )

    # -- the loop ---------------------------------------------------------------------
    def train_step(self, model: torch.nn.Module) -> torch.Tensor:
        """One optimizer step; returns the mean micro-batch loss as a device tensor (no host sync)."""
        batch = self.train_blocks[self.sampler.next_indices()].to(self.world.device, non_blocking=True)
        total = torch.zeros((), dtype=torch.float32, device=self.world.device)
        micro_batches = batch.split(self.loop.micro_batch_size)
        for i, micro in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            with self.algorithm.no_sync(model) if not last else contextlib.nullcontext():
                with autocast(self.precision, self.world.device):
                    # use_cache=False: a KV cache per forward would make each compiled block guard on
                    # its own cache layer (a recompile per layer, then the recompile limit)
                    loss = model(input_ids=micro, labels=micro, use_cache=False).loss / self.accum
                self.engine.backward(loss, last=last)
            total += loss.detach().float()
        self.engine.step()
        return total

    def backward_once(self, model: torch.nn.Module) -> None:
        """A forward/backward of the first training micro-batch whose gradients are dropped (no
        optimizer step, no sampler or RNG draw): for wrappers that settle their layout on it."""
        micro = self.train_blocks[: self.loop.micro_batch_size].to(self.world.device)
        with autocast(self.precision, self.world.device):
            loss = model(input_ids=micro, labels=micro, use_cache=False).loss
        loss.backward()
        self.engine.optimizer.zero_grad(set_to_none=True)

    def fit(self, logger: MetricsLogger) -> TrainResult:
        cfg = self.loop
        start_time = time.perf_counter()
        self.engine.prepare(self.algorithm)
        model = self.engine.forward_model
        self.compile_wrapped(model)
        if self.step > 0 and not self.world.incarnation:  # resumed from a checkpoint (a replacement heals later)
            self.algorithm.on_resume(model, lambda: self.backward_once(model))
        self.algorithm.attach_trainer_state(self.heal_state, self.load_heal_state)
        self.algorithm.on_train_start(self.engine.outer_model, self.engine.optimizer)
        self.engine.weights_changed()  # the start-up broadcast
        self.bytes_meter.start(self.algorithm.bytes_sent())
        logger.advance(self.step)
        loss, eval_loss, eval_bpb = float("nan"), {}, {}
        last = cfg.stop_at or cfg.steps
        stop = False
        metrics: dict[str, float] = {}  # the algorithm's metrics since the last log line (a sync may fall between)
        while self.step < last and not stop:
            tick = time.perf_counter()
            with self.throughput.measure():
                loss_t = self.train_step(model)
                self.step += 1
                metrics = accumulate_metrics(
                    metrics,
                    self._with_bytes(
                        self.algorithm.after_optimizer_step(self.step, self.engine.outer_model, self.engine.optimizer)
                    ),
                )
                self.engine.weights_changed()
                stop = self.algorithm.should_stop(self.step, cfg.steps)
                final = self.step == cfg.steps or stop
                if final:  # an overlapped outer step still in flight lands before the final evaluation
                    metrics = accumulate_metrics(
                        metrics, self._with_bytes(self.algorithm.drain(self.engine.outer_model))
                    )
                    self.engine.weights_changed()
                log_now = self.step % self.logger_cfg.log_every == 0 or final or self.step == last
                evaluating = self.step % cfg.eval_every == 0 or final
                saving = self.step % cfg.checkpoint_every == 0 or self.step == last or stop
                if log_now:
                    loss = float(loss_t)  # the one host sync of a log interval
                    self.check_finite_loss(loss)  # a NaN in between is caught here, or by save()'s weight check
                elif evaluating or saving:
                    self.throughput.drain()  # this step's queued device work belongs to the clock, not to eval
            if log_now:
                logger.advance(1, loss=loss)
                totals = {"comm/bytes_sent_total": float(self.bytes_meter.total)} if self.bytes_meter.active else {}
                totals["time/train_s"] = (
                    time.perf_counter() - start_time
                )  # wall time since fit() began (curves vs time)
                logger.log(
                    self.step,
                    {"train/loss": loss, "lr": self.engine.lr(), **metrics, **totals, **self.throughput.read()},
                )
                metrics = {}
            else:
                logger.advance(1)
            self.step_times.append(time.perf_counter() - tick)  # eval and checkpoints excluded
            if evaluating:
                eval_loss, eval_bpb = evaluate_bits(
                    self.model,
                    self.val_blocks,
                    cfg.micro_batch_size,
                    self.world.device,
                    self.precision,
                    self.token_bytes,
                )
                logger.log(self.step, eval_metrics(eval_loss, eval_bpb))
            if saving:
                self.save()
        self.algorithm.on_train_end(self.engine.outer_model)
        return TrainResult(
            self.step,
            loss,
            eval_loss,
            time.perf_counter() - start_time,
            self.bytes_meter.total if self.bytes_meter.active else None,
            eval_bpb,
        )

    def _with_bytes(self, metrics: dict[str, float]) -> dict[str, float]:
        """A step's metrics plus `comm/bytes_sent`, what this replica sent in that step (summed per log line)."""
        sent = self.bytes_meter.step(metrics.get("outer/bytes_sent"), self.algorithm.bytes_sent())
        return metrics if not sent else {**metrics, "comm/bytes_sent": sent}
