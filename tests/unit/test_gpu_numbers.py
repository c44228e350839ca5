"""GPU figures that must not mislead, checked on CPU with fake device clocks, events and RNG."""

from __future__ import annotations

import pytest
import torch

from decentrain.algorithms.pretraining.inner_outer import InnerOuterAlgorithm, InnerOuterConfig
from decentrain.algorithms.pretraining.precision import DeviceTimer, set_tf32
from decentrain.core.metrics import Throughput
from decentrain.core.world import World, plan_placement
from decentrain.testing import tiny_trainer

CUDA = torch.device("cuda", 0)


def test_ranks_sharing_a_gpu_report_mfu_against_their_share_of_its_peak():
    placement = plan_placement("cuda", local_ranks=4, gpus=1)
    assert [placement.share(r, 4) for r in range(4)] == [4, 4, 4, 4]
    assert [plan_placement("cuda", 3, 2).share(r, 3) for r in range(3)] == [2, 1, 2]  # cuda:0 has ranks 0 and 2
    assert plan_placement("cpu", 4, 0).share(1, 4) == 1
    t = Throughput(1000, 4000, flops_per_tok=1e6, peak=1e10, device=torch.device("cpu"), device_share=4)
    with t.measure():
        pass
    t.seconds = 1.0  # 1000 tokens/s x 1e6 FLOP = 1e9 FLOP/s of the rank's 1e10 / 4
    assert t.read()["perf/mfu"] == pytest.approx(0.4)


class FakeDevice:
    """A device that runs behind the host: work queued by `launch` finishes only when synchronized."""

    def __init__(self):
        self.now, self.queued = 0.0, 0.0

    def clock(self) -> float:
        return self.now

    def launch(self, seconds: float) -> None:
        self.now += 1e-3  # the host returns at once
        self.queued += seconds

    def synchronize(self) -> None:
        self.now += self.queued
        self.queued = 0.0


def test_throughput_clock_counts_the_queued_device_work_when_drained():
    dev = FakeDevice()
    t = Throughput(100, 100, 1.0, None, CUDA, synchronize=dev.synchronize, clock=dev.clock)
    with t.measure():
        dev.launch(2.0)
        t.drain()  # the trainer does this before an evaluation that is not a log step
    assert t.seconds == pytest.approx(2.001)


def test_trainer_drains_the_device_before_an_evaluation_between_log_steps(tmp_path, monkeypatch):
    from decentrain.core.metrics import LoggerConfig, MetricsLogger

    trainer = tiny_trainer(tmp_path, eval_every=1, checkpoint_every=100)
    trainer.logger_cfg = LoggerConfig(log_every=100, console=False, progress=False)
    drained = []
    monkeypatch.setattr(trainer.throughput, "drain", lambda: drained.append(trainer.step))
    trainer.fit(MetricsLogger(trainer.logger_cfg, tmp_path, 0))
    assert drained == [1]  # step 1 evaluates without a log read; step 2 (final) reads the loss instead


class FakeEvent:
    """torch.cuda.Event on a fake device timeline."""

    device_time = 0.0

    def __init__(self, enable_timing: bool = False):
        self.t = None

    def record(self, stream=None) -> None:
        self.t = FakeEvent.device_time

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "FakeEvent") -> float:
        return (end.t - self.t) * 1e3


class _Paced(InnerOuterAlgorithm):
    def setup(self, model):
        pass

    def outer_step(self, model):
        return {}

    def outer_state(self):
        return {}

    def load_outer_state(self, state):
        pass


def test_adaptive_pacing_times_the_device_not_the_kernel_launches(monkeypatch):
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    algo = _Paced(InnerOuterConfig(inner_steps=4, adaptive_inner_steps=True), World(device=CUDA))
    algo.on_train_start(torch.nn.Linear(1, 1), None)
    for _ in range(3):
        FakeEvent.device_time += 0.25  # the GPU takes 250 ms per step; the host launches it in ~0
        algo.after_optimizer_step(1, torch.nn.Linear(1, 1), None)
    assert algo.pace.step_time == pytest.approx(0.25)
    timer = DeviceTimer(torch.device("cpu"))
    timer.start()
    assert 0 <= timer.stop() < 30.0  # seconds (not ms); generous: a loaded box may stall this thread


def test_tf32_is_switched_on_for_cuda_only_and_can_be_turned_off():
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    try:
        set_tf32(torch.device("cpu"), True)
        assert matmul.fp32_precision == before
        set_tf32(CUDA, True)
        assert matmul.fp32_precision == "tf32"
        set_tf32(CUDA, False)
        assert matmul.fp32_precision == "ieee"
    finally:
        matmul.fp32_precision = before
        torch.backends.cudnn.conv.fp32_precision = before


def test_checkpoint_rng_includes_the_cuda_generator(monkeypatch):
    from decentrain.algorithms.pretraining.trainer import rng_state, set_rng_state

    cuda_rng = {"state": torch.tensor([1, 2, 3], dtype=torch.uint8)}
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device=None: cuda_rng["state"].clone())
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda s, device=None: cuda_rng.update(state=s.clone()))
    saved = rng_state(CUDA)
    assert torch.equal(saved["cuda"], torch.tensor([1, 2, 3], dtype=torch.uint8))
    cuda_rng["state"] = torch.tensor([9, 9, 9], dtype=torch.uint8)  # the run drew more numbers
    set_rng_state(saved, CUDA)
    assert torch.equal(cuda_rng["state"], torch.tensor([1, 2, 3], dtype=torch.uint8))
    assert "cuda" not in rng_state(torch.device("cpu"))


def test_compile_model_compiles_the_wrapped_module_not_the_bare_one(tmp_path, monkeypatch):
    import decentrain.algorithms.pretraining.trainer as trainer_mod
    from decentrain.core.metrics import LoggerConfig, MetricsLogger

    compiled = []
    monkeypatch.setattr(trainer_mod, "apply_compile", lambda m, scope: compiled.append((m, scope)) or m)
    trainer = tiny_trainer(tmp_path, compile="model", steps=1, eval_every=100, checkpoint_every=100)
    assert compiled == []  # not at construction: the algorithm has not wrapped the model yet

    class Wrapper(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.module = inner

        def forward(self, *a, **k):
            return self.module(*a, **k)

    wrapped = []
    monkeypatch.setattr(trainer.algorithm, "wrap_model", lambda m: wrapped.append(Wrapper(m)) or wrapped[-1])
    trainer.logger_cfg = LoggerConfig(console=False, progress=False)
    trainer.fit(MetricsLogger(trainer.logger_cfg, tmp_path, 0))
    assert compiled == [(wrapped[0], "model")]


def test_a_resumed_run_replays_one_backward_for_ddp_and_drops_its_gradients(tmp_path, monkeypatch):
    """DDP without find_unused_parameters rebuilds its buckets after the first backward; a resumed run
    replays that backward (DDP.on_resume) instead of paying a graph walk every step."""
    from torch.nn.parallel import DistributedDataParallel

    from decentrain.core.metrics import LoggerConfig, MetricsLogger

    trainer = tiny_trainer(tmp_path, steps=2, eval_every=100, checkpoint_every=100)
    trainer.step = 1  # as after maybe_resume
    sampler_before = trainer.sampler.state_dict()
    calls = []

    def on_resume(model, backward_once):
        backward_once()
        calls.append([p.grad for p in trainer.model.parameters()])
        calls.append(trainer.sampler.state_dict())

    monkeypatch.setattr(trainer.algorithm, "on_resume", on_resume)
    trainer.logger_cfg = LoggerConfig(console=False, progress=False)
    trainer.fit(MetricsLogger(trainer.logger_cfg, tmp_path, 0))
    assert calls and all(g is None for g in calls[0]) and calls[1] == sampler_before

    from decentrain.algorithms.ddp.ddp import DDPConfig

    ddp_model = DistributedDataParallel.__new__(DistributedDataParallel)  # isinstance only
    trainer.algorithm.cfg = DDPConfig()
    replayed = []
    type(trainer.algorithm).on_resume(trainer.algorithm, ddp_model, lambda: replayed.append(1))
    type(trainer.algorithm).on_resume(trainer.algorithm, trainer.model, lambda: replayed.append(2))
    assert replayed == [1]  # unwrapped (one process): nothing to settle
