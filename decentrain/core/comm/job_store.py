"""The job store of a gossip job over several hosts: one c10d TCPStore server, in a process that runs no worker.

`python -m decentrain.core.comm.job_store --port 29400` (one per job, started before the hosts, the
way torchft's lighthouse is). Every host's launcher (`launcher=hosts launcher.store=HOST:PORT`)
and every worker is a client: gossip membership, heal requests, incarnation records and the
per-pair gloo rendezvous all live here, so any worker host may die without taking them along.

Lifetime: until SIGTERM/SIGINT (launch/slurm.sbatch stops it when the job's step ends). If it
dies first, each host's launcher notices at its next poll, stops its workers and exits with one
line; a restart of the job (resume=true) continues from the last checkpoints. The store holds
no state worth keeping: it is the rendezvous, not a checkpoint.

torch's TCPStore is the server (the store the workers already use on one host); this module
only starts it where no worker runs, and parses endpoints.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

log = logging.getLogger(__name__)


def parse_endpoint(endpoint: str, field: str = "launcher.store") -> tuple[str, int]:
    """`host:port` -> (host, port); ValueError (one line naming `field`) for anything else."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{field}={endpoint!r} must be HOST:PORT (the job store's address, port 1-65535)")
    return host.strip("[]"), int(port)


def connect(endpoint: str, timeout_s: float = 60.0) -> dist.TCPStore:
    """A client of the job store at `endpoint` (RuntimeError if it cannot be reached within `timeout_s`)."""
    host, port = parse_endpoint(endpoint)
    return dist.TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_s))


def serve(host: str, port: int, stop: threading.Event, ready_file: str | None = None) -> None:
    """Host the store at host:port until `stop` is set (port 0: any free port, written to `ready_file`)."""
    store = dist.TCPStore(host, port, is_master=True, wait_for_workers=False)
    log.info("job store listening on %s:%d", host, store.port)
    if ready_file:  # written last and whole, so a watcher never reads half an address
        tmp = Path(f"{ready_file}.tmp")
        tmp.write_text(f"{host}:{store.port}\n")
        tmp.replace(ready_file)
    stop.wait()
    log.info("job store on %s:%d stopping", host, store.port)
    del store


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m decentrain.core.comm.job_store", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default: every interface)")
    parser.add_argument("--port", type=int, default=29400, help="port (0: any free one, see --ready-file)")
    parser.add_argument("--ready-file", help="write HOST:PORT here once the store accepts clients")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[job_store] %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve(args.host, args.port, stop, args.ready_file)


if __name__ == "__main__":
    main()
