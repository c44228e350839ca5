"""Heal authority comes from the launchers alone (issue 25, item 6; issue 40, item 3).

At the old main a heal request was honoured when the store record `launcher/incarnation/<rank>`
held its incarnation, and any store client could `set` that record: a forged record got a forged
request served and the real replacement's refused; a replayed valid request was served each time.
At 78c329b the record held the launchers' signature, which was also the requester's token: a
store client that copied it was served. Now the record holds only public data (the worker's public
key and the launchers' certificate of it); the worker's private key reaches it by environment; a
request is signed over the donor's current nonce, which moves on after each grant.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest
import torch.distributed as dist

from decentrain.core.comm.incarnation import INCARNATION_KEY, PUBLIC_KEY_ENV, SECRET_ENV, IncarnationCheck, LauncherKey
from decentrain.core.comm.membership import Membership

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


def _open_donor(store, key: LauncherKey, rank: int = 0) -> Membership:
    donor = _member(store, key, rank, 0)
    assert donor.heal_requests() == []  # opens it as a donor: nothing asked yet
    return donor


def test_a_forged_incarnation_record_gets_no_heal_served_and_the_real_replacement_still_is():
    store, key = _store(), LauncherKey(b"s" * 32)
    _launched_world(store, key)
    donor = _open_donor(store, key)
    # a worker's store client writes the record of an incarnation the launcher did not start
    # (and the old main's plain record), then asks to be healed as that incarnation
    store.set(f"{INCARNATION_KEY}/2", "1")
    store.set(f"{INCARNATION_KEY}/2/1", "f" * 193)
    _member(store, key, 2, 1, "f" * 193).request_heal(0)
    assert donor.heal_requests() == []
    # the launcher restarts rank 2: a record no launcher signed is no claim, so it takes incarnation 1
    inc, token = key.claim(store, JOB, 2)
    assert inc == 1 and store.get(f"{INCARNATION_KEY}/2/1") != b"f" * 193
    # overwriting the launcher's record, or pre-writing the next ones, vouches for nothing and refuses nothing
    real = store.get(f"{INCARNATION_KEY}/2/{inc}")
    store.set(f"{INCARNATION_KEY}/2/{inc + 1}", real)  # a valid record, copied to the next number
    _member(store, key, 2, inc, token).request_heal(0)
    assert donor.heal_requests() == [(2, inc)]


def test_a_token_of_another_launcher_rank_or_job_is_refused():
    store, key = _store(), LauncherKey(b"s" * 32)
    _launched_world(store, key)
    donor = _open_donor(store, key)
    inc, _ = key.claim(store, JOB, 3)
    # a worker cannot certify: it never holds the secret
    _, other_launcher = LauncherKey(b"o" * 32).claim(_store(), JOB, 3)
    _member(store, key, 3, inc, other_launcher).request_heal(0)
    assert donor.heal_requests() == []
    _, rank1 = key.claim(_store(), JOB, 1)  # rank 1's token, as rank 3
    _member(store, key, 3, inc, rank1).request_heal(0)
    assert donor.heal_requests() == []
    _, other_job = key.claim(_store(), "another-job", 3)
    _member(store, key, 3, inc, other_job).request_heal(0)
    assert donor.heal_requests() == []
    store.set(f"heal/0/3/{inc}", "3,1,zz")  # malformed
    assert donor.heal_requests() == [] and donor.drops["heal_unsigned"] == 4


def test_a_replayed_heal_request_is_not_served_again_but_the_replacement_asking_again_is():
    store, key = _store(), LauncherKey(b"s" * 32)
    _launched_world(store, key)
    donor = _open_donor(store, key)
    inc, token = key.claim(store, JOB, 2)
    replacement = _member(store, key, 2, inc, token)
    replacement.request_heal(0)
    assert donor.heal_requests() == [(2, inc)]
    raw = store.get(f"heal/0/2/{inc}")  # a store client copies the valid request and posts it again
    for value in (b"junk", raw):
        store.set(f"heal/0/2/{inc}", value)
        assert donor.heal_requests() == []
    assert donor.drops["heal_stale"] == 1
    replacement.request_heal(0)  # its transfer failed (say): it asks again, over the donor's new nonce
    assert donor.heal_requests() == [(2, inc)]
    # a later incarnation supersedes this one: its requests are not even read, at this donor or another
    key.claim(store, JOB, 2)
    other = _open_donor(store, key, 1)
    replacement.request_heal(0)
    replacement.request_heal(1)
    assert donor.heal_requests() == [] and other.heal_requests() == []


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
env = {k: v for k, v in os.environ.items() if k.startswith(keep)}
open(sys.argv[1] + "." + os.environ["RANK"], "w").write(json.dumps(env))
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
        check = IncarnationCheck.from_env(env)
        _, _, pub, cert, _ = check.heal_request(1 - rank, "0" * 32, rank, 0).split(",")  # signed with its own key
        assert check.record_key(rank, 0, f"{pub},{cert}") == pub  # which the launchers certified for this rank
        assert check.record_key(1 - rank, 0, f"{pub},{cert}") is None


def test_a_replacement_asks_no_rank_whose_incarnation_a_launcher_replaced():
    """A lost host takes several ranks: their old progress keys must not make them donors (each would cost an
    attempt)."""
    from decentrain.algorithms.noloco.healing import Healer

    store, key = _store(), LauncherKey(b"s" * 32)
    _launched_world(store, key)
    for rank, done in ((0, 5), (1, 4), (3, 7)):  # rank 3 was furthest along when its host died
        _member(store, key, rank, 0).publish(done)
    key.claim(store, JOB, 3)  # the new host's launcher started rank 3 again (and rank 2, the asker)
    inc, token = key.claim(store, JOB, 2)
    healer = Healer(_member(store, key, 2, inc, token), pairs=None, get_state=dict, load_state=lambda s: None)
    assert healer._donors(set()) == [(0, 0), (1, 0)]


# -- issue 40: what a store client can read, a requester that dies mid-request, garbage incarnation records --


def test_a_store_client_that_copies_the_store_gets_no_heal_and_the_real_replacement_does():
    """At 78c329b the launcher's token of each incarnation sat in its store record: a client that copied it
    and asked first was served the donor's state, and the real replacement was refused as "repeated"."""
    store, key = _store(), LauncherKey(b"s" * 32)
    _launched_world(store, key)
    donor = _open_donor(store, key)
    inc, token = key.claim(store, JOB, 2)  # the launcher restarts rank 2
    record = store.get(f"{INCARNATION_KEY}/2/{inc}").decode()
    _member(store, key, 2, inc, record).request_heal(0)  # the copier asks first, as rank 2, with what it read
    assert donor.heal_requests() == []
    assert token.split(",")[0] not in record  # the worker's private key is not in the store
    _member(store, key, 2, inc, token).request_heal(0)
    assert donor.heal_requests() == [(2, inc)]


def test_a_requester_that_dies_between_add_and_set_blocks_no_later_heal():
    """At 78c329b `heal/<donor>/n` counted requests: an `add` without its `set` (a replacement that died in
    between, or any store client) stopped the donor reading every later request."""
    store, key = _store(), LauncherKey(b"s" * 32)
    _launched_world(store, key)
    donor = _open_donor(store, key)
    store.add("heal/0/n", 1)  # counted, never written
    store.set("heal/1/n", "x")  # and a non-integer at another donor's counter
    inc, token = key.claim(store, JOB, 2)
    _member(store, key, 2, inc, token).request_heal(0)
    assert donor.heal_requests() == [(2, inc)]


@pytest.mark.parametrize("garbage", ["records", "next"])
def test_bad_incarnation_records_block_no_claim(garbage):
    """At 78c329b 64 pre-written records, or a non-numeric `next`, made every claim of the rank raise."""
    store, key = _store(), LauncherKey(b"s" * 32)
    if garbage == "records":  # garbage, an empty value, and the value core/shared_store.peek reads as "missing"
        for i, value in enumerate([b"\x00decentrain-absent\x00", b""] + [b"f" * 128] * 62):
            store.set(f"{INCARNATION_KEY}/2/{i}", value)
    else:
        store.set(f"{INCARNATION_KEY}/2/next", "x")
    _launched_world(store, key)
    inc, token = key.claim(store, JOB, 2)
    assert inc == 1
    donor = _open_donor(store, key)
    _member(store, key, 2, inc, token).request_heal(0)
    assert donor.heal_requests() == [(2, inc)]


def test_the_forged_and_replayed_requests_are_refused_as_an_ordinary_user_too():
    from decentrain.testing import rerun_unprivileged

    rerun_unprivileged(
        __file__,
        "forged_incarnation_record or replayed_heal_request or another_launcher "
        "or copies_the_store or dies_between or bad_incarnation_records",
    )
