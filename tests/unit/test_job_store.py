"""The job store of a multi-host gossip job (core/comm/job_store.py) and each host's launcher as its client."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from decentrain.core.comm.incarnation import INCARNATION_KEY, SECRET_ENV, IncarnationCheck, LauncherKey
from decentrain.core.comm.job_store import connect, parse_endpoint
from decentrain.core.launch.config import LAUNCHERS, HostsConfig
from decentrain.core.launch.launcher import HostSlot, launch_survivors
from decentrain.testing import rerun_unprivileged, start_store

# a worker that says it is up, then waits to be stopped (the test synchronises on its file, not on time)
WORKER = """
import os, signal, sys
open(sys.argv[1] + "." + os.environ["RANK"], "w").write(os.environ["DECENTRAIN_INCARNATION"])
signal.pause()
"""


@pytest.mark.parametrize("bad", ["", "host", "host:", ":29400", "host:0", "host:70000", "host:29a"])
def test_a_bad_store_address_fails_in_one_line_naming_the_field(bad):
    with pytest.raises(ValueError, match=r"^launcher\.store="):
        HostsConfig(nnodes=2, store=bad, job_id="j")


def test_hosts_launcher_config_checks_node_rank_and_job_id():
    with pytest.raises(ValueError, match=r"^launcher\.node_rank=2"):
        HostsConfig(nnodes=2, store="h:1", node_rank=2, job_id="j")
    with pytest.raises(ValueError, match=r"^launcher\.job_id="):
        HostsConfig(nnodes=2, store="h:1", job_id="a b")
    with pytest.raises(ValueError, match=r"^launcher: unknown field\(s\) \['store'\]"):  # the job store is hosts' own
        LAUNCHERS.config({"name": "local", "store": "h:1"})
    assert parse_endpoint("[::1]:29400") == ("::1", 29400)


def test_a_dead_job_store_stops_every_host_launcher_and_its_workers_with_one_line(tmp_path, monkeypatch):
    (tmp_path / "waiter.py").write_text(WORKER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv(SECRET_ENV, "s" * 32)
    store, addr = start_store(tmp_path)
    errors: dict[int, BaseException] = {}

    def host(node: int) -> None:
        try:
            launch_survivors(
                [str(tmp_path / f"up{node}")], 1, tmp_path, module="waiter", slot=HostSlot(addr, node, 2, "job")
            )
        except RuntimeError as e:
            errors[node] = e

    hosts = [threading.Thread(target=host, args=(n,)) for n in (0, 1)]
    try:
        for t in hosts:
            t.start()
        while not all((tmp_path / f"up{n}.{n}").exists() for n in (0, 1)):  # each host's rank started
            assert all(t.is_alive() for t in hosts), errors
            threading.Event().wait(0.05)
        assert [(tmp_path / f"up{n}.{n}").read_text() for n in (0, 1)] == ["0", "0"]
        store.send_signal(signal.SIGKILL)
        for t in hosts:
            t.join(60)
    finally:
        store.kill()
    assert set(errors) == {0, 1}
    for e in errors.values():
        assert str(e).startswith(f"the job store at {addr} is gone") and "resume=true" in str(e) and "\n" not in str(e)
    for node in (0, 1):  # the workers went down with their launchers
        pid = int(__import__("json").loads((tmp_path / f"workers.node{node}.json").read_text())[str(node)])
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_a_host_started_for_a_node_rank_again_starts_replacements(tmp_path, monkeypatch):
    """The second launcher of node 1 (a machine started in a dead host's place) gets incarnation 1."""
    (tmp_path / "once.py").write_text(
        "import os, sys\nopen(sys.argv[1] + '.' + os.environ['RANK'], 'w')"
        ".write(os.environ['DECENTRAIN_INCARNATION'])\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv(SECRET_ENV, "s" * 32)
    store, addr = start_store(tmp_path)
    try:
        for attempt in ("a", "b"):
            assert launch_survivors([str(tmp_path / attempt)], 2, module="once", slot=HostSlot(addr, 1, 2, "job")) == {
                2: 0,
                3: 0,
            }
        assert [(tmp_path / f"{a}.{r}").read_text() for a in "ab" for r in (2, 3)] == ["0", "0", "1", "1"]
        from decentrain.core.shared_store import peek

        check = IncarnationCheck("job", LauncherKey(b"s" * 32).public_hex)
        records = [peek(connect(addr), f"decentrain/attempt0/shared/{INCARNATION_KEY}/3/{i}") for i in range(3)]
        assert [check.record_key(3, i, r) is not None for i, r in enumerate(records[:2])] == [True, True]
        assert records[2] is None
    finally:
        store.kill()


# rank 2 of incarnation 0 fails once told to (after the test wrote its garbage); every other worker waits for "go"
FAIL_ONCE = """
import os, sys, threading
out, rank, inc = sys.argv[1], os.environ["RANK"], os.environ["DECENTRAIN_INCARNATION"]
open(f"{out}.{rank}.{inc}", "w").close()
wait = threading.Event()
target = f"{out}.die" if (rank, inc) == ("2", "0") else f"{out}.go"
while not os.path.exists(target):
    wait.wait(0.05)
sys.exit(1 if target.endswith(".die") else 0)
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("garbage", ["records", "next"])
def test_bad_incarnation_records_stop_no_worker_and_the_replacement_starts(tmp_path, monkeypatch, garbage):
    """At 78c329b a non-numeric `next` (its `add` cut the launcher's store connection) or 64 pre-written
    records made the replacement's claim raise, and the launcher then stopped every worker on its host."""
    (tmp_path / "fail_once.py").write_text(FAIL_ONCE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv(SECRET_ENV, "s" * 32)
    store, addr = start_store(tmp_path)
    out, errors, codes = tmp_path / "w", [], {}

    def host() -> None:
        try:
            codes.update(
                launch_survivors([str(out)], 2, module="fail_once", max_restarts=1, slot=HostSlot(addr, 1, 2, "job"))
            )
        except RuntimeError as e:
            errors.append(e)

    launcher = threading.Thread(target=host)
    try:
        launcher.start()
        assert _until(lambda: all(Path(f"{out}.{r}.0").exists() for r in (2, 3)) or not launcher.is_alive())
        client, records = connect(addr), f"decentrain/attempt0/shared/{INCARNATION_KEY}/2"
        if garbage == "records":
            for i in range(1, 65):
                client.set(f"{records}/{i}", "f" * 128)
        else:
            client.set(f"{records}/next", "x")
        Path(f"{out}.die").touch()
        assert _until(lambda: Path(f"{out}.2.1").exists() or not launcher.is_alive()), errors
        Path(f"{out}.go").touch()
        launcher.join(60)
    finally:
        Path(f"{out}.go").touch()
        launcher.join(60)
        store.kill()
    assert not errors and codes == {2: 0, 3: 0}, (errors, codes)


def _until(cond, timeout_s: float = 60.0) -> bool:
    end, tick = time.monotonic() + timeout_s, threading.Event()
    while not cond():
        if time.monotonic() > end:
            return False
        tick.wait(0.05)
    return True


def test_bad_incarnation_records_stop_no_worker_as_an_ordinary_user_too():
    rerun_unprivileged(__file__, "bad_incarnation_records_stop_no_worker_and")
