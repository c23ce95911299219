#!/usr/bin/env python3
"""Bulk TCP for background traffic: a source that sends as fast as TCP lets it, and a
sink that counts what arrives.

  bulk.py sink --port P          prints READY once listening; for every line MARK on
                                 stdin prints "MARK <CLOCK_MONOTONIC ns> <bytes so far>"
  bulk.py source --to IP --port P [--dscp D]
                                 connects and sends until killed; prints CONNECTED

Standard library only, so it runs unchanged in any host (namespace, container, VM).
The orchestrator marks the sink when the measured blocks start and end: the bytes
between the two marks over the time between them is the flow's goodput while the
incast ran.
"""
import argparse
import selectors
import socket
import sys
import time


def sink(port: int) -> None:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", port))
    listener.listen(4)
    listener.setblocking(False)
    print("READY", flush=True)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(sys.stdin, selectors.EVENT_READ, "stdin")
    received = 0
    buf = memoryview(bytearray(1 << 20))
    while True:
        for key, _ in sel.select():
            if key.data == "accept":
                conn, _ = listener.accept()
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ, "data")
            elif key.data == "stdin":
                line = sys.stdin.readline()
                if not line:
                    return
                if line.strip() == "MARK":
                    print(f"MARK {time.monotonic_ns()} {received}", flush=True)
            else:
                try:
                    n = key.fileobj.recv_into(buf)
                except ConnectionError:
                    n = 0
                if n == 0:
                    sel.unregister(key.fileobj)
                    key.fileobj.close()
                received += n


def source(to: str, port: int, dscp: int) -> None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
    s.connect((to, port))
    print("CONNECTED", flush=True)
    data = memoryview(bytearray(1 << 20))
    while True:
        s.sendall(data)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=["sink", "source"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--to", help="the sink's address (source)")
    ap.add_argument("--dscp", type=int, default=0)
    args = ap.parse_args()
    if args.role == "sink":
        sink(args.port)
    else:
        if not args.to:
            sys.exit("bulk.py source needs --to")
        source(args.to, args.port, args.dscp)


if __name__ == "__main__":
    main()
