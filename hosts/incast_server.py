#!/usr/bin/env python3
"""Incast server: answers every request on its connection with a fragment of data.

Protocol (one persistent TCP connection per client, as a storage server keeps):
  client -> server  8-byte big-endian size N > 0   the server sends N bytes
  client -> server  8-byte zero                    the server replies with a 4-byte
                                                   length and its TCP_INFO as JSON,
                                                   then waits for the next connection
Standard library only, so it runs unchanged in any host (namespace, container, VM).
Prints READY once listening: the orchestrator waits for that line, never for time.

With --netns (repeated, one per server host) one process serves many hosts: it opens
each listener inside that host's network namespace (a socket stays in the namespace it
was made in), then serves every connection from one event loop, refilling a socket
whenever the kernel says it has room, as a blocking send in a process of its own
would. The data still leaves from each host's own TCP stack; only the processes are
shared (hundreds of servers without hundreds of interpreters).
"""
import argparse
import ctypes
import json
import os
import resource
import selectors
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


def listen(port, dscp):
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit the TOS byte: every data segment carries the class's DSCP.
    listener.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
    listener.bind(("0.0.0.0", port))
    listener.listen(16)
    return listener


CLONE_NEWNET = 0x40000000


def listen_in(netns, port, dscp):
    """A listener made inside the network namespace at path `netns`."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open("/proc/self/ns/net", os.O_RDONLY)
    target = os.open(netns, os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({netns}): {os.strerror(ctypes.get_errno())}")
        try:
            return listen(port, dscp)
        finally:
            if libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back home failed")
    finally:
        os.close(target)
        os.close(home)


class Connection:
    """One server's connection in the shared loop: read a request, send its bytes."""

    def __init__(self, conn, payload):
        self.conn, self.payload = conn, payload
        self.head, self.left, self.out = b"", 0, b""

    def readable(self):
        """Read what the client sent; False when the connection is over."""
        part = self.conn.recv(REQUEST.size - len(self.head))
        if not part:
            return False
        self.head += part
        if len(self.head) == REQUEST.size:
            (size,) = REQUEST.unpack(self.head)
            self.head = b""
            if size == 0:
                report = json.dumps(tcpinfo.read(self.conn)).encode()
                self.out = struct.pack("!I", len(report)) + report
            else:
                self.left = size
        return True

    def writable(self):
        """Send what fits now; False once the report is out (the client is done)."""
        if self.out:
            self.out = self.out[self.conn.send(self.out):]
            return bool(self.out)
        self.left -= self.conn.send(self.payload[:min(self.left, CHUNK)])
        return True

    def wants(self):
        return selectors.EVENT_WRITE if self.left or self.out else selectors.EVENT_READ


def serve_many(listeners, payload):
    sel = selectors.DefaultSelector()
    for lst in listeners:
        lst.setblocking(False)
        sel.register(lst, selectors.EVENT_READ, None)
    while True:
        for key, events in sel.select():
            if key.data is None:
                try:
                    conn, _ = key.fileobj.accept()
                except BlockingIOError:
                    continue
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.setblocking(False)
                sel.register(conn, selectors.EVENT_READ, Connection(conn, payload))
                continue
            c = key.data
            try:
                alive = c.readable() if events & selectors.EVENT_READ and not (c.left or c.out) \
                    else c.writable()
            except (BlockingIOError, InterruptedError):
                alive = True
            except (ConnectionError, TimeoutError):
                alive = False
            if not alive:
                sel.unregister(c.conn)
                c.conn.close()
            elif c.wants() != key.events:
                sel.modify(c.conn, c.wants(), c)


def main():
    # A socket per server: hundreds of servers pass the default limit of 1024 files.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=5001)
    ap.add_argument("--dscp", type=int, default=0, help="DSCP of the data this server sends")
    ap.add_argument("--netns", action="append", default=[], metavar="PATH[:DSCP]",
                    help="serve in this network namespace (repeat: one process, many servers)")
    args = ap.parse_args()
    payload = memoryview(bytearray(os.urandom(64)) * (CHUNK // 64))
    if args.netns:
        listeners = []
        for spec in args.netns:
            path, _, dscp = spec.partition(":")
            listeners.append(listen_in(path, args.port, int(dscp) if dscp else args.dscp))
        print("READY", flush=True)
        serve_many(listeners, payload)
        return
    listener = listen(args.port, args.dscp)
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
