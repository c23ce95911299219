#!/usr/bin/env python3
"""Print the TCP_INFO of every established connection on a local port, one JSON line each:
  {"peer": "10.0.0.1", "peer_port": 40312, "info": {...struct tcp_info...}}

For servers the testbed does not write (memcached, ...): their sender-side TCP state is
read from outside the process through the kernel's socket diagnostics (NETLINK_SOCK_DIAG,
what `ss -ti` uses), in the host's network namespace. Standard library only.
"""
import argparse
import ipaddress
import json
import os
import socket
import struct

import tcpinfo  # beside this file: Python puts a script's directory on its path

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
INET_DIAG_INFO = 2
TCP_ESTABLISHED = 1

NLMSGHDR = struct.Struct("=IHHII")
# struct inet_diag_req_v2: family, protocol, ext, pad, states, then inet_diag_sockid
# (sport, dport big-endian, src[16], dst[16], if, cookie[2]).
REQUEST = struct.Struct("=BBBxI" + "HH16s16sI8s")
# struct inet_diag_msg: family, state, timer, retrans, inet_diag_sockid, expires,
# rqueue, wqueue, uid, inode.
MESSAGE = struct.Struct("=BBBB" + "2s2s16s16sI8s" + "IIIII")
RTATTR = struct.Struct("=HH")


def _request(family: int) -> bytes:
    body = REQUEST.pack(family, socket.IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), 1 << TCP_ESTABLISHED,
                        0, 0, b"", b"", 0, b"\xff" * 8)
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + body


def _attributes(data: bytes):
    while len(data) >= RTATTR.size:
        length, kind = RTATTR.unpack_from(data)
        if length < RTATTR.size:
            return
        yield kind, data[RTATTR.size:length]
        data = data[(length + 3) & ~3:]


def established(port: int, family: int = socket.AF_INET):
    """(peer address, peer port, tcp_info dict) of the established sockets on local port."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
        nl.send(_request(family))
        while True:
            data = nl.recv(1 << 16)
            while len(data) >= NLMSGHDR.size:
                length, kind, _, _, _ = NLMSGHDR.unpack_from(data)
                if kind == NLMSG_DONE:
                    return
                if kind == NLMSG_ERROR:
                    (err,) = struct.unpack_from("=i", data, NLMSGHDR.size)
                    raise OSError(-err, os.strerror(-err))
                msg = data[NLMSGHDR.size:length]
                fields = MESSAGE.unpack_from(msg)
                sport, dport, dst = (int.from_bytes(fields[4], "big"), int.from_bytes(fields[5], "big"),
                                     fields[7])
                if sport == port:
                    info = {}
                    for akind, value in _attributes(msg[MESSAGE.size:]):
                        if akind == INET_DIAG_INFO:
                            info = tcpinfo.decode(value)
                    addr = ipaddress.ip_address(dst[:4] if family == socket.AF_INET else dst)
                    yield str(addr), dport, info
                data = data[(length + 3) & ~3:]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True, help="local port of the connections")
    args = ap.parse_args()
    for peer, peer_port, info in established(args.port):
        print(json.dumps({"peer": peer, "peer_port": peer_port, "info": info}), flush=True)


if __name__ == "__main__":
    main()
