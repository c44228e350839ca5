"""`decentrain algorithm=diloco` and `algorithm=streaming_diloco` on 2 local gloo ranks."""

import pytest

from decentrain.testing import metrics, run_train

pytestmark = pytest.mark.integration


def test_diloco_recipe_takes_an_outer_step_every_h(tmp_path):
    run_train(tmp_path, "algorithm=diloco", "algorithm.inner_steps=3", "train.steps=6", "train.eval_every=6")
    rows = metrics(tmp_path)
    assert [r["step"] for r in rows if "outer/pseudo_grad_norm" in r] == [3, 6]
    assert all(r["outer/pseudo_grad_norm"] > 0 for r in rows if "outer/pseudo_grad_norm" in r)
