"""`decentrain algorithm=streaming_diloco` with an int4 payload on 2 local gloo ranks."""

import pytest

from decentrain.testing import metrics, run_train

pytestmark = pytest.mark.integration


def test_streaming_recipe_syncs_fragments_in_turn_with_int4_payload(tmp_path):
    run_train(
        tmp_path,
        "algorithm=streaming_diloco",
        "algorithm.inner_steps=4",
        "algorithm.num_fragments=2",
        "algorithm.overlap_steps=1",
        "algorithm.quantization=int4",
        "train.steps=8",
        "train.eval_every=8",
    )
    rows = metrics(tmp_path)
    landed = [(r["step"], k) for r in rows for k in r if k.startswith("outer/fragment_")]
    # fragment 0 sends at steps 4, 8 (lands 5; the one from 8 lands at the end), fragment 1 at 2, 6 (lands 3, 7)
    assert landed == [(3, "outer/fragment_1"), (5, "outer/fragment_0"), (7, "outer/fragment_1")]
