#!/usr/bin/env python3
"""Sample the switch ports' qdisc statistics every INTERVAL of the clock, in the network
namespace it runs in, and write a record whenever a queue's occupancy or drop count
changed. Standard library only (rtnetlink RTM_GETQDISC dumps, what `tc -s qdisc` reads).

Made for virtual time (User-Mode Linux with time-travel=inf-cpu), where the kernel has
no BPF events and where sampling costs the experiment nothing: the CPU is infinitely
fast, so the sampler wakes exactly every interval and the network does not see it.

Records (little-endian, 40 bytes): ts_ns u64 (CLOCK_MONOTONIC), ifindex u32, queue i32
(class c for the leaf qdisc of handle base+c, -1 for the port's root qdisc), qlen u32,
backlog u32, drops u32, pool u32 (the bytes the queue's shared pool holds, 0xFFFFFFFF
where it is in none), packets u64 (dequeued so far). A pool changes only when one of
its queues does, so the queue's record that changed carries the pool's new count.

Prints READY once the first sample is taken; on SIGINT or SIGTERM it stops and prints
RECORDS n, SAMPLES n and SPAN_NS (from the first sample to the end).
"""
import argparse
import ctypes
import signal
import socket
import struct
import sys
import time

from rtnl import qdisc_stats  # noqa: E402  (hosts/rtnl.py, beside this file)

RECORD = struct.Struct("<QIiIIIIQ")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--interval-us", type=float, required=True)
    ap.add_argument("--ifindex", required=True, help="comma-separated ports to watch")
    ap.add_argument("--leaf-major-base", type=lambda s: int(s, 0), default=0x10)
    ap.add_argument("--root-major", type=lambda s: int(s, 0), default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    ports = {int(i) for i in a.ifindex.split(",")}
    # A sleep may end up to the timer slack (50 us by default) late; 1 ns keeps the
    # samples on their grid (in virtual time: exactly, but for the 256 ns UML charges
    # per clock read).
    ctypes.CDLL(None, use_errno=True).prctl(29, 1, 0, 0, 0)     # PR_SET_TIMERSLACK
    interval_ns = int(a.interval_us * 1000)
    stop = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, f: stop.append(s))
    last: dict = {}
    records = samples = 0
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as nl, open(a.out, "wb") as out:
        nl.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        nxt = first = time.monotonic_ns()
        while not stop:
            now = time.monotonic_ns()
            buf = []
            for ifindex, major, qlen, backlog, drops, packets, pool in qdisc_stats(nl, samples + 1):
                if ifindex not in ports:
                    continue
                if major == a.root_major:
                    queue = -1
                elif a.leaf_major_base <= major < a.leaf_major_base + 8:
                    queue = major - a.leaf_major_base
                else:
                    continue
                state = (qlen, backlog, drops)
                if last.get((ifindex, queue)) != state:
                    last[(ifindex, queue)] = state
                    buf.append(RECORD.pack(now, ifindex, queue, qlen, backlog, drops, pool, packets))
            out.write(b"".join(buf))
            records += len(buf)
            samples += 1
            if samples == 1:
                print("READY", flush=True)
            nxt += interval_ns
            delay = nxt - time.monotonic_ns()
            if delay > 0:
                time.sleep(delay / 1e9)
            else:
                nxt = time.monotonic_ns()   # behind (a slow clock): no burst of catch-up samples
    print(f"RECORDS {records}", flush=True)
    print(f"SAMPLES {samples}", flush=True)
    print(f"SPAN_NS {time.monotonic_ns() - first}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
