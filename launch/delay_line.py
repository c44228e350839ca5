"""Userspace delay line: hold every packet of an NFQUEUE for a fixed time, then accept it.

This kernel has no netem, so `launch/wan_emulation.sh` adds latency with an
iptables rule `-i eth0 -j NFQUEUE --queue-num Q` on each namespace's INPUT
(ingress; on egress the held packets throttle TCP's own pacing) and runs
this loop inside that namespace:

    ip netns exec dt0 python launch/delay_line.py --queue 0 --delay-ms 50

The delay is constant, so a FIFO released in arrival order keeps packet order.
Needs root, `libnetfilter-queue-dev` (Debian) and `NetfilterQueue` (PyPI).
"""

from __future__ import annotations

import argparse
import collections
import select
import signal
import sys
import time

from netfilterqueue import COPY_META, NetfilterQueue, Packet


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queue", type=int, default=0, help="NFQUEUE number (queues are per network namespace)")
    ap.add_argument("--delay-ms", type=float, required=True, help="one-way delay added to every queued packet")
    # A 100 Mbit/s link with 50 ms delay holds ~430 full-size packets; leave plenty of room.
    ap.add_argument("--max-len", type=int, default=16384, help="kernel queue length (packets beyond it are dropped)")
    args = ap.parse_args()

    delay = args.delay_ms / 1000.0
    held: collections.deque[tuple[float, Packet]] = collections.deque()

    def release_due() -> None:
        now = time.monotonic()
        while held and held[0][0] <= now:
            held.popleft()[1].accept()

    def on_packet(pkt: Packet) -> None:
        held.append((time.monotonic() + delay, pkt))
        release_due()  # also release here: under load `run()` may not return for a while

    nfq = NetfilterQueue()
    # COPY_META: we never read the payload, so the kernel copies none to us.
    nfq.bind(args.queue, on_packet, max_len=args.max_len, mode=COPY_META, sock_len=8 << 20)
    fd = nfq.get_fd()

    def stop(*_: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"delay_line ready queue={args.queue} delay_ms={args.delay_ms}", flush=True)
    try:
        while True:
            timeout = max(0.0, held[0][0] - time.monotonic()) if held else None
            readable, _, _ = select.select([fd], [], [], timeout)
            if readable:
                nfq.run(block=False)
            release_due()
    finally:
        while held:  # let in-flight packets through rather than leave them queued
            held.popleft()[1].accept()
        nfq.unbind()


if __name__ == "__main__":
    sys.exit(main())
