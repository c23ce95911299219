#!/usr/bin/env python3
"""Memcached multiget client: synchronized multigets striped over many memcached servers.

Every server holds its share of a block as values of at most --value bytes; for each
block the client sends every server one `get` for all of its keys at once and sends the
next only when every server's answer is complete (the barrier of a striped read, as a
web server's multiget of a page's objects has). Output, one line each, on stdout:
  CONNECTED                      connected, every server's keys stored
  WARM                           warm-up blocks done; waits for a GO line on stdin
  BLOCK <i> <start_ns> <end_ns> <last_server>   a measured block (CLOCK_MONOTONIC)
  MEASURED                       the connections stay open until a line on stdin
  DONE
Standard library only, so it runs unchanged in any host (namespace, container, VM).
"""
import argparse
import random
import selectors
import sys
import time

from incast_client import connect_all  # beside this file: Python puts a script's directory on its path

END = b"END\r\n"


def keys_of(server: int, fragment: int, value: int) -> list[tuple[str, int]]:
    """(key, value size) of one server's share of a block."""
    sizes = [value] * (fragment // value) + ([fragment % value] if fragment % value else [])
    return [(f"incast:{server}:{k}", n) for k, n in enumerate(sizes)]


def store(sock, keys) -> None:
    for key, n in keys:
        sock.sendall(f"set {key} 0 0 {n}\r\n".encode() + b"x" * n + b"\r\n")
        reply = recv_line(sock)
        if reply != b"STORED\r\n":
            sys.exit(f"memcached_client: set {key}: {reply.decode(errors='replace').strip()}")


def recv_line(sock) -> bytes:
    line = b""
    while not line.endswith(b"\r\n"):
        part = sock.recv(1)
        if not part:
            raise ConnectionError("memcached closed the connection")
        line += part
    return line


def answer_bytes(keys) -> int:
    """Bytes of a complete answer to a get of keys: memcached's framing is fixed."""
    return sum(len(f"VALUE {key} 0 {n}\r\n") + n + 2 for key, n in keys) + len(END)


def read_block(socks, requests, sizes, order, sel, buf):
    """One synchronized multiget; returns (start_ns, end_ns, index of the last server)."""
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
            tails[fd] = (tails.get(fd, b"") + bytes(buf[max(0, n - len(END)):n]))[-len(END):]
            if remaining[fd] == 0:
                del remaining[fd]
                last = index[fd]
                if tails[fd] != END:   # a miss or an error: the answer is not the values
                    raise RuntimeError(f"server {index[fd]} answered {tails[fd]!r} at the end of a multiget")
    return start, time.monotonic_ns(), last


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--servers", required=True, help="comma-separated server addresses")
    ap.add_argument("--fragments", required=True, help="value bytes per server per block, comma-separated")
    ap.add_argument("--value", type=int, default=16384, help="bytes per value (key)")
    ap.add_argument("--dscp", default="", help="DSCP of the requests and ACKs per server (default 0)")
    ap.add_argument("--port", type=int, default=11211)
    ap.add_argument("--blocks", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    servers = args.servers.split(",")
    fragments = [int(x) for x in args.fragments.split(",")]
    dscps = [int(x) for x in args.dscp.split(",")] if args.dscp else [0] * len(servers)
    if not (len(servers) == len(fragments) == len(dscps)):
        sys.exit("memcached_client: --servers, --fragments and --dscp need one entry per server")

    socks = connect_all(servers, args.port, dscps)
    keys = [keys_of(i, f, args.value) for i, f in enumerate(fragments)]
    for s, k in zip(socks, keys):
        store(s, k)
    requests = [("get " + " ".join(key for key, _ in k) + "\r\n").encode() for k in keys]
    sizes = [answer_bytes(k) for k in keys]
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
        read_block(socks, requests, sizes, order, sel, buf)
    print("WARM", flush=True)
    if sys.stdin.readline().strip() != "GO":
        sys.exit("memcached_client: expected GO on stdin")
    for i in range(args.blocks):
        rng.shuffle(order)
        start, end, last = read_block(socks, requests, sizes, order, sel, buf)
        print(f"BLOCK {i} {start} {end} {last}", flush=True)
    print("MEASURED", flush=True)
    sys.stdin.readline()    # the servers' TCP state is read while the connections are up
    for s in socks:
        s.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
