#!/usr/bin/env python3
"""Incast client: synchronized reads of blocks striped over many servers.

For each block it asks every server for its fragment at once and asks for the next
block only when every fragment of this one has arrived (the barrier that makes incast).
Output, one line each, on stdout:
  CONNECTED                      all connections are up
  WARM                           warm-up blocks done; waits for a GO line on stdin
  BLOCK <i> <start_ns> <end_ns> <last_server>   a measured block (CLOCK_MONOTONIC)
  FLOW <server_index> <json>     the server's TCP_INFO at the end
  DONE
Standard library only, so it runs unchanged in any host (namespace, container, VM).
"""
import argparse
import json
import random
import selectors
import socket
import struct
import sys
import time

REQUEST = struct.Struct("!Q")


def connect_all(servers, port, dscps):
    socks = []
    for addr, dscp in zip(servers, dscps):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # ACKs and requests travel in the server's class too.
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.connect((addr, port))
        socks.append(s)
    return socks


def read_block(socks, fragments, order, sel, buf):
    """One synchronized read; returns (start_ns, end_ns, index of the last server)."""
    remaining = {}
    start = time.monotonic_ns()
    for i in order:
        socks[i].sendall(REQUEST.pack(fragments[i]))
        remaining[socks[i].fileno()] = fragments[i]
    index = {s.fileno(): i for i, s in enumerate(socks)}
    last = -1
    while remaining:
        for key, _ in sel.select():
            fd = key.fd
            if fd not in remaining:
                continue
            n = key.fileobj.recv_into(buf, min(len(buf), remaining[fd]))
            if n == 0:
                raise ConnectionError(f"server {index[fd]} closed the connection")
            remaining[fd] -= n
            if remaining[fd] == 0:
                del remaining[fd]
                last = index[fd]
    return start, time.monotonic_ns(), last


def tcp_infos(socks):
    for s in socks:
        s.setblocking(True)
        s.sendall(REQUEST.pack(0))
    for i, s in enumerate(socks):
        (length,) = struct.unpack("!I", recv_exact(s, 4))
        yield i, json.loads(recv_exact(s, length))


def recv_exact(s, n):
    data = b""
    while len(data) < n:
        part = s.recv(n - len(data))
        if not part:
            raise ConnectionError("server closed before its TCP_INFO report")
        data += part
    return data


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", required=True, help="comma-separated server addresses")
    ap.add_argument("--fragments", required=True, help="bytes per server per block, comma-separated")
    ap.add_argument("--dscp", default="", help="DSCP per server, comma-separated (default 0)")
    ap.add_argument("--port", type=int, default=5001)
    ap.add_argument("--blocks", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-wait", action="store_true", help="do not wait for GO after warm-up")
    args = ap.parse_args()
    servers = args.servers.split(",")
    fragments = [int(x) for x in args.fragments.split(",")]
    dscps = [int(x) for x in args.dscp.split(",")] if args.dscp else [0] * len(servers)
    if not (len(servers) == len(fragments) == len(dscps)):
        sys.exit("incast_client: --servers, --fragments and --dscp need one entry per server")

    socks = connect_all(servers, args.port, dscps)
    print("CONNECTED", flush=True)
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    buf = memoryview(bytearray(1 << 20))
    rng = random.Random(args.seed)
    order = list(range(len(socks)))
    for _ in range(args.warmup):
        rng.shuffle(order)
        read_block(socks, fragments, order, sel, buf)
    print("WARM", flush=True)
    if not args.no_wait and sys.stdin.readline().strip() != "GO":
        sys.exit("incast_client: expected GO on stdin")
    for i in range(args.blocks):
        rng.shuffle(order)
        start, end, last = read_block(socks, fragments, order, sel, buf)
        print(f"BLOCK {i} {start} {end} {last}", flush=True)
    for s in socks:
        sel.unregister(s)
    for i, info in tcp_infos(socks):
        print(f"FLOW {i} {json.dumps(info)}", flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
