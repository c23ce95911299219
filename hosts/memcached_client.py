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
import sys

from incast_client import client_parser, connect_all, per_server, run_blocks  # beside this file: Python puts a script's directory on its path

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


def main():
    ap = client_parser(__doc__, 11211)
    ap.add_argument("--value", type=int, default=16384, help="bytes per value (key)")
    args = ap.parse_args()
    servers, fragments, dscps = per_server(args)

    socks = connect_all(servers, args.port, dscps)
    keys = [keys_of(i, f, args.value) for i, f in enumerate(fragments)]
    for s, k in zip(socks, keys):
        store(s, k)
    requests = [("get " + " ".join(key for key, _ in k) + "\r\n").encode() for k in keys]
    sizes = [answer_bytes(k) for k in keys]
    print("CONNECTED", flush=True)
    run_blocks(socks, requests, sizes, args.blocks, args.warmup, args.seed, tail=END)
    print("MEASURED", flush=True)
    sys.stdin.readline()    # the servers' TCP state is read while the connections are up
    for s in socks:
        s.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
