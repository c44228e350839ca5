"""The heal payload a replacement accepts from a peer: exactly its own structure, pickle-free."""

import torch

from decentrain.core.heal import decode_state, encode_state


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
