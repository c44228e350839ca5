"""The heal payload a replacement accepts from a peer: exactly its own structure, pickle-free."""

import torch

from decentrain.core.comm.heal_transfer import decode_state, encode_state


def _state(out_features=2, value=1.0):
    torch.manual_seed(0)
    m = torch.nn.Linear(3, out_features)
    opt = torch.optim.AdamW(m.parameters())
    for p in m.parameters():
        p.grad = torch.full_like(p, value)
    opt.step()
    return {"step": 7, "model": m.state_dict(), "optimizer": opt.state_dict(), "sampler": {"epoch": 0, "position": 8}}


def test_a_peers_state_round_trips_with_optimizer_int_keys_and_counters():
    donor, mine = _state(), _state(value=0.0)
    got = decode_state(*encode_state(donor), mine)
    assert isinstance(got, dict) and got["step"] == 7 and set(got["optimizer"]["state"]) == {0, 1}
    assert torch.equal(got["model"]["weight"], donor["model"]["weight"])
    assert torch.equal(got["optimizer"]["state"][0]["exp_avg"], donor["optimizer"]["state"][0]["exp_avg"])


def test_a_state_of_another_shape_structure_or_garbage_is_refused_with_a_reason():
    mine = _state()
    skeleton, blob = encode_state(mine)
    assert "(3,) torch.float32 != (2,) torch.float32" in decode_state(*encode_state(_state(out_features=3)), mine)
    assert "keys differ" in decode_state(*encode_state({**mine, "extra": 1}), mine)
    assert decode_state(b"{", blob, mine).startswith("unparsable")
    assert decode_state(skeleton, b"garbage", mine).startswith("unparsable")
    nan = _state()
    nan["model"]["weight"][0, 0] = float("nan")
    assert "non-finite" in decode_state(*encode_state(nan), mine)


def _tamper(state, path, value):
    import json

    skeleton, blob = encode_state(state)
    doc = json.loads(skeleton)
    node = doc
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return json.dumps(doc, allow_nan=True).encode(), blob


def test_scalars_must_keep_their_exact_type_be_finite_and_in_range():
    mine = _state()
    assert isinstance(decode_state(*_tamper(mine, ["step"], 8), mine), dict)
    cases = {
        "type differs": (["step"], 7.0),  # a float step
        "negative": (["optimizer", "param_groups", 0, "lr"], -0.1),
        "out of range": (["step"], 1 << 60),
    }
    for why, (path, value) in cases.items():
        assert why in decode_state(*_tamper(mine, path, value), mine), why
    # NaN / Infinity are not JSON numbers: refused at parse time.
    for bad in (float("nan"), float("inf"), float("-inf")):
        assert decode_state(*_tamper(mine, ["optimizer", "param_groups", 0, "lr"], bad), mine).startswith("unparsable")
    skeleton, blob = encode_state(mine)
    assert "non-finite" in decode_state(skeleton.replace(b'"step": 7', b'"step": 1e400'), blob, {**mine, "step": 0.5})


def test_heal_requests_are_honoured_only_from_ranks_the_launcher_restarted():
    from datetime import timedelta

    import torch.distributed as dist

    from decentrain.core.comm.incarnation import IncarnationCheck, LauncherKey
    from decentrain.core.comm.membership import Membership

    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=5))
    key = LauncherKey(b"k" * 32)
    check = IncarnationCheck("job", key.public_hex)
    for rank in range(4):
        key.claim(store, "job", rank)  # incarnation 0 of every rank
    inc, token = key.claim(store, "job", 2)  # the launcher restarted rank 2 once
    donor = Membership(store, rank=0, world_size=4, authority=check)
    donor.heal_requests()  # requests before this process are stale
    for rank, i, tok in (
        (2, inc, token),
        (2, inc, token),
        (3, 1, token),
        (2, 2, token),
        (1, 5, ""),
    ):  # 1 real, 1 duplicate, 3 forged
        Membership(
            store, rank=rank, world_size=4, incarnation=i, authority=IncarnationCheck("job", check.public_hex, tok)
        ).request_heal(0)
    assert donor.heal_requests() == [(2, 1)]


def test_a_donor_holds_one_snapshot_at_a_time(monkeypatch):
    import threading

    from decentrain.algorithms.noloco.healing import Healer

    release = threading.Event()
    sent, snapshots = [], []

    class Requests:
        def __init__(self):
            self.batches = [[(1, 1), (2, 1), (3, 1)], [], [], []]

        def heal_requests(self):
            return self.batches.pop(0) if self.batches else []

    class Pairs:
        def get(self, rank, inc):
            release.wait(10)
            return None, 1

    monkeypatch.setattr("decentrain.algorithms.noloco.healing.send_state", lambda pg, o, s, b: sent.append(o))
    state = {"step": 1, "algorithm": {"round": 0}, "w": torch.zeros(2)}
    h = Healer(Requests(), Pairs(), get_state=lambda: snapshots.append(1) or state, load_state=lambda s: None)
    h.serve([torch.zeros(1)])
    h.serve([torch.zeros(1)])  # the first snapshot is still being sent: nothing new is taken
    assert len(snapshots) == 1 and len(h._pending) == 2
    release.set()
    h.finish()
    h.serve([torch.zeros(1)])
    h.finish()
    h.serve([torch.zeros(1)])
    h.finish()
    assert len(snapshots) == 3 and h._pending == []
