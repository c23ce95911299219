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
import resource
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


def read_block(socks, requests, sizes, order, sel, buf, tail=b""):
    """One synchronized read: send every server its request (in order), then read
    sizes[i] bytes from each; an answer must end with `tail`. Returns (start_ns,
    end_ns, index of the last server)."""
    remaining, tails = {}, {}
    start = time.monotonic_ns()
    for i in order:
        socks[i].sendall(requests[i])
        remaining[socks[i].fileno()] = sizes[i]
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
            if tail:
                tails[fd] = (tails.get(fd, b"") + bytes(buf[max(0, n - len(tail)):n]))[-len(tail):]
            if remaining[fd] == 0:
                del remaining[fd]
                last = index[fd]
                if tails.get(fd, b"") != tail:   # e.g. a miss or an error instead of the data
                    raise RuntimeError(f"server {index[fd]} answered {tails[fd]!r} at the end")
    return start, time.monotonic_ns(), last


def run_blocks(socks, requests, sizes, blocks, warmup, seed, wait_go=True, tail=b""):
    """The warm-up blocks, WARM, a GO line on stdin, then the measured blocks, one BLOCK
    line each, in a request order shuffled per block from the seed."""
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    buf = memoryview(bytearray(1 << 20))
    rng = random.Random(seed)
    order = list(range(len(socks)))
    for _ in range(warmup):
        rng.shuffle(order)
        read_block(socks, requests, sizes, order, sel, buf, tail)
    print("WARM", flush=True)
    if wait_go and sys.stdin.readline().strip() != "GO":
        sys.exit(f"{sys.argv[0]}: expected GO on stdin")
    for i in range(blocks):
        rng.shuffle(order)
        start, end, last = read_block(socks, requests, sizes, order, sel, buf, tail)
        print(f"BLOCK {i} {start} {end} {last}", flush=True)
    sel.close()


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


def client_parser(doc: str, port: int) -> argparse.ArgumentParser:
    """The arguments every client of ours takes (incast.workload.Workload.start_client)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--servers", required=True, help="comma-separated server addresses")
    ap.add_argument("--fragments", required=True, help="bytes per server per block, comma-separated")
    ap.add_argument("--dscp", default="", help="DSCP per server, comma-separated (default 0)")
    ap.add_argument("--port", type=int, default=port)
    ap.add_argument("--blocks", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    return ap


def per_server(args) -> tuple[list[str], list[int], list[int]]:
    """(addresses, fragments, DSCPs), one entry per server."""
    servers = args.servers.split(",")
    fragments = [int(x) for x in args.fragments.split(",")]
    dscps = [int(x) for x in args.dscp.split(",")] if args.dscp else [0] * len(servers)
    if not (len(servers) == len(fragments) == len(dscps)):
        sys.exit(f"{sys.argv[0]}: --servers, --fragments and --dscp need one entry per server")
    return servers, fragments, dscps


def main():
    # A socket per server: hundreds of servers pass the default limit of 1024 files.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    ap = client_parser(__doc__, 5001)
    ap.add_argument("--no-wait", action="store_true", help="do not wait for GO after warm-up")
    args = ap.parse_args()
    servers, fragments, dscps = per_server(args)

    socks = connect_all(servers, args.port, dscps)
    print("CONNECTED", flush=True)
    run_blocks(socks, [REQUEST.pack(f) for f in fragments], fragments, args.blocks, args.warmup,
               args.seed, wait_go=not args.no_wait)
    for i, info in tcp_infos(socks):
        print(f"FLOW {i} {json.dumps(info)}", flush=True)
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
