"""comm_sync on loopback with 2 workers: rows carry the bytes each method actually moved."""

import argparse

import pytest

from benchmarks.comm_sync import run_world, summarise

pytestmark = [pytest.mark.dist, pytest.mark.slow]


def test_loopback_rows_record_the_real_fragment_bytes():
    args = argparse.Namespace(repeats=1, fragments=4, fragment_share=0.3, sizes=[1000], timeout=240, rate="100mbit")
    rows = {r["method"]: r for r in summarise(run_world("loopback", 2, args), args)["rows"]}
    assert set(rows) == {"pair", "ring", "fragment", "pair_1pg"}
    assert rows["pair"]["bytes"] == rows["ring"]["bytes"] == 4000
    assert rows["fragment"]["bytes"] == 1200  # 300 fp32 of the 1000-element payload, not 1000 / 4
    assert rows["fragment"]["upload_bytes"] == 1200.0  # ring with N=2 uploads 2·(N−1)/N of it
    assert all(t > 0 for r in rows.values() for t in r["times"])
