#!/usr/bin/env python3
"""Incast server: answers every request on its connection with a fragment of data.

Protocol (one persistent TCP connection per client, as a storage server keeps):
  client -> server  8-byte big-endian size N > 0   the server sends N bytes
  client -> server  8-byte zero                    the server replies with a 4-byte
                                                   length and its TCP_INFO as JSON,
                                                   then waits for the next connection
Standard library only, so it runs unchanged in any host (namespace, container, VM).
Prints READY once listening: the orchestrator waits for that line, never for time.
"""
import argparse
import json
import os
import socket
import struct

import tcpinfo  # beside this file: Python puts a script's directory on its path

REQUEST = struct.Struct("!Q")
CHUNK = 4 << 20   # one preallocated buffer: sending costs the kernel, not Python


def recv_exact(conn, n):
    data = b""
    while len(data) < n:
        part = conn.recv(n - len(data))
        if not part:
            return None
        data += part
    return data


def serve(conn, payload):
    while True:
        head = recv_exact(conn, REQUEST.size)
        if head is None:
            return
        (size,) = REQUEST.unpack(head)
        if size == 0:
            report = json.dumps(tcpinfo.read(conn)).encode()
            conn.sendall(struct.pack("!I", len(report)) + report)
            return
        while size:
            n = min(size, CHUNK)
            conn.sendall(payload[:n])
            size -= n


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=5001)
    ap.add_argument("--dscp", type=int, default=0, help="DSCP of the data this server sends")
    args = ap.parse_args()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit the TOS byte: every data segment carries the class's DSCP.
    listener.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, args.dscp << 2)
    listener.bind(("0.0.0.0", args.port))
    listener.listen(16)
    payload = memoryview(bytearray(os.urandom(64)) * (CHUNK // 64))
    print("READY", flush=True)
    while True:
        conn, _ = listener.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            serve(conn, payload)


if __name__ == "__main__":
    try:
        main()
    except (KeyboardInterrupt, BrokenPipeError):
        pass
