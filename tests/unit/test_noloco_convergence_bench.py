"""The NoLoCo-protocol benchmark's own arithmetic: replica averaging, curve means, time to DiLoCo's final loss."""

import math

import pytest
import torch

from benchmarks.noloco_convergence import average_state, first_step_at, mean_curve, wan_to_target

pytestmark = pytest.mark.unit


def test_average_state_averages_floats_and_keeps_the_rest():
    a = {"w": torch.tensor([1.0, 2.0]), "i": torch.tensor([3])}
    b = {"w": torch.tensor([3.0, 6.0]), "i": torch.tensor([5])}
    out = average_state([a, b])
    assert torch.equal(out["w"], torch.tensor([2.0, 4.0]))
    assert torch.equal(out["i"], torch.tensor([3]))


def test_mean_curve_is_the_pointwise_replica_mean():
    c1 = [{"step": 8, "val_loss": 4.0}, {"step": 16, "val_loss": 3.0}]
    c2 = [{"step": 8, "val_loss": 5.0}, {"step": 16, "val_loss": 2.0}]
    assert mean_curve([c1, c2]) == [{"step": 8, "val_loss": 4.5}, {"step": 16, "val_loss": 2.5}]


def test_first_step_at_interpolates():
    curve = [{"step": 10, "val_loss": 4.0}, {"step": 20, "val_loss": 3.0}]
    assert first_step_at(curve, 3.5) == pytest.approx(15.0)
    assert first_step_at(curve, 4.5) == 10.0
    assert first_step_at(curve, 2.0) is None


def test_wan_to_target_pairs_noloco_against_diloco_final():
    diloco = [{"step": 10, "val_loss": 4.0}, {"step": 20, "val_loss": 3.0}]
    noloco = [{"step": 10, "val_loss": 3.0}, {"step": 20, "val_loss": 2.5}]
    w = wan_to_target(noloco, diloco, {"noloco": 1.0, "diloco": 2.0})
    # DiLoCo reaches its own final loss (3.0) at step 20 (40 s); NoLoCo at step 10 (10 s)
    assert (w["noloco_step"], w["diloco_step"]) == (10.0, 20.0)
    assert w["ratio"] == pytest.approx(10 / 40)
    never = wan_to_target([{"step": 20, "val_loss": 3.5}], diloco, {"noloco": 1.0, "diloco": 2.0})
    assert never["ratio"] is None and not math.isnan(never["diloco_wan_s"])
