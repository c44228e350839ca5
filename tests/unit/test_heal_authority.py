"""Heal authority comes from the launchers alone (issue 25, item 6).

At the old main a heal request was honoured when the store record `launcher/incarnation/<rank>`
held its incarnation, and any store client could `set` that record: a forged record got a forged
request served and the real replacement's refused; a replayed valid request was served each time.
Now the record is the launchers' signature, written once (compare_set), the request carries the
requester's token, and a donor serves each incarnation once.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from decentrain.core.comm.membership import Membership
from decentrain.core.launch.incarnation import (INCARNATION_KEY, PUBLIC_KEY_ENV, SECRET_ENV, TOKEN_ENV, IncarnationCheck,
                                         LauncherKey)

JOB = "job1"


def _store() -> dist.HashStore:
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=5))
    return store


def _launched_world(store, key: LauncherKey, world: int = 4) -> dict[int, str]:
    """Incarnation 0 of every rank, as the launcher starts them; {rank: token}."""
    return {rank: key.claim(store, JOB, rank)[1] for rank in range(world)}


def _member(store, key: LauncherKey | None, rank: int, inc: int, token: str = "") -> Membership:
    check = IncarnationCheck(JOB, (key or LauncherKey(b"x" * 32)).public_hex, token)
    return Membership(store, rank=rank, world_size=4, incarnation=inc, authority=check)


def test_a_forged_incarnation_record_gets_no_heal_served_and_the_real_replacement_still_is():
    store, key = _store(), LauncherKey(b"s" * 32)
    _launched_world(store, key)
    donor = _member(store, key, 0, 0)
    donor.heal_requests()
    # a worker's store client writes the record of an incarnation the launcher did not start
    # (and the old main's plain record), then asks to be healed as that incarnation
    store.set(f"{INCARNATION_KEY}/2", "1")
    store.set(f"{INCARNATION_KEY}/2/1", "f" * 128)
    _member(store, key, 2, 1, "f" * 128).request_heal(0)
    assert donor.heal_requests() == []
    # the launcher restarts rank 2: the pre-written record of incarnation 1 cannot be replaced,
    # so it takes incarnation 2, whose record it writes once; the real replacement is served
    inc, token = key.claim(store, JOB, 2)
    assert inc == 2 and store.get(f"{INCARNATION_KEY}/2/1") == b"f" * 128
    # overwriting the launcher's record, or pre-writing the next ones, vouches for nothing and refuses nothing
    store.set(f"{INCARNATION_KEY}/2/{inc}", "0" * 128)
    store.set(f"{INCARNATION_KEY}/2/{inc + 1}", key.sign(JOB, 2, inc))
    _member(store, key, 2, inc, token).request_heal(0)
    assert donor.heal_requests() == [(2, inc)]


def test_a_token_signed_with_another_key_or_for_another_rank_is_refused():
    store, key = _store(), LauncherKey(b"s" * 32)
    _launched_world(store, key)
    donor = _member(store, key, 0, 0)
    donor.heal_requests()
    other = LauncherKey(b"o" * 32)  # a worker cannot sign: it never holds the secret
    inc, _ = key.claim(store, JOB, 3)
    _member(store, key, 3, inc, other.sign(JOB, 3, inc)).request_heal(0)
    _member(store, key, 1, inc, key.sign(JOB, 3, inc)).request_heal(0)  # rank 3's token, as rank 1
    _member(store, key, 3, inc, key.sign("another-job", 3, inc)).request_heal(0)
    store.set("heal/0/99", "3,1,zz")  # malformed
    assert donor.heal_requests() == []


def test_a_replayed_heal_request_is_served_once_and_a_superseded_incarnation_not_at_all():
    store, key = _store(), LauncherKey(b"s" * 32)
    _launched_world(store, key)
    donor = _member(store, key, 0, 0)
    donor.heal_requests()
    inc, token = key.claim(store, JOB, 2)
    _member(store, key, 2, inc, token).request_heal(0)
    assert donor.heal_requests() == [(2, inc)]
    raw = store.get("heal/0/1")  # a store client copies the valid request and posts it again, twice
    for _ in range(2):
        n = store.add("heal/0/n", 1)
        store.set(f"heal/0/{n}", raw)
    assert donor.heal_requests() == []
    # a later incarnation supersedes this one: its token is no good at another donor either
    key.claim(store, JOB, 2)
    other = _member(store, key, 1, 0)
    other.heal_requests()
    _member(store, key, 2, inc, token).request_heal(1)
    assert other.heal_requests() == []


def test_without_the_launchers_key_no_heal_request_is_honoured():
    store, key = _store(), LauncherKey(b"s" * 32)
    _launched_world(store, key)
    inc, token = key.claim(store, JOB, 2)
    donor = Membership(store, rank=0, world_size=4, authority=IncarnationCheck.from_env({}))
    donor.heal_requests()
    _member(store, key, 2, inc, token).request_heal(0)
    assert donor.authority is None and donor.heal_requests() == []


def test_a_job_secret_shorter_than_16_bytes_fails_in_one_line():
    with pytest.raises(ValueError, match=SECRET_ENV):
        LauncherKey.from_env({SECRET_ENV: "short"})
    with pytest.raises(ValueError, match=f"{SECRET_ENV} is unset"):
        LauncherKey.from_env({}, required=True)


WORKER = """
import json, os, sys
keep = ("DECENTRAIN_", "TORCHELASTIC_RUN_ID", "RANK")
open(sys.argv[1] + "." + os.environ["RANK"], "w").write(json.dumps({k: v for k, v in os.environ.items() if k.startswith(keep)}))
"""


def test_the_launcher_gives_workers_the_public_key_and_their_token_never_the_secret(tmp_path, monkeypatch):
    from decentrain.core.launch.launcher import launch_survivors

    (tmp_path / "envdump.py").write_text(WORKER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv(SECRET_ENV, "t" * 32)
    assert launch_survivors([str(tmp_path / "env")], 2, module="envdump") == {0: 0, 1: 0}
    key = LauncherKey(b"t" * 32)
    for rank in (0, 1):
        env = json.loads((tmp_path / f"env.{rank}").read_text())
        assert SECRET_ENV not in env and env[PUBLIC_KEY_ENV] == key.public_hex
        check = IncarnationCheck(env["TORCHELASTIC_RUN_ID"], key.public_hex)
        assert check.signed(rank, 0, env[TOKEN_ENV]) and not check.signed(1 - rank, 0, env[TOKEN_ENV])


def test_a_replacement_asks_no_rank_whose_incarnation_a_launcher_replaced():
    """A lost host takes several ranks: their old progress keys must not make them donors (each would cost an attempt)."""
    from decentrain.algorithms.noloco.healing import Healer

    store, key = _store(), LauncherKey(b"s" * 32)
    _launched_world(store, key)
    for rank, done in ((0, 5), (1, 4), (3, 7)):  # rank 3 was furthest along when its host died
        _member(store, key, rank, 0).publish(done)
    key.claim(store, JOB, 3)  # the new host's launcher started rank 3 again (and rank 2, the asker)
    inc, token = key.claim(store, JOB, 2)
    healer = Healer(_member(store, key, 2, inc, token), pairs=None, get_state=dict, load_state=lambda s: None)
    assert healer._donors(set()) == [(0, 0), (1, 0)]


def test_the_forged_and_replayed_requests_are_refused_as_an_ordinary_user_too():
    from decentrain.testing import rerun_unprivileged

    rerun_unprivileged(__file__, "forged_incarnation_record or replayed_heal_request or another_key")
