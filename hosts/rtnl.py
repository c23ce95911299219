"""rtnetlink for the programs in hosts/: qdisc statistics as `tc -s qdisc` reads them
(RTM_GETQDISC dumps). Standard library only; imported by its siblings (hosts/ is their
sys.path[0])."""
import socket
import struct

RTM_GETQDISC = 38
RTM_NEWQDISC = 36
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
TCA_KIND, TCA_XSTATS, TCA_STATS2 = 1, 4, 7
TCA_STATS_BASIC, TCA_STATS_QUEUE = 1, 3
NLMSGHDR = struct.Struct("=IHHII")
TCMSG = struct.Struct("=BxxxiIII")          # family, ifindex, handle, parent, info
RTATTR = struct.Struct("=HH")
BASIC = struct.Struct("=QI")                # gnet_stats_basic: bytes, packets
QUEUE = struct.Struct("=IIIII")             # gnet_stats_queue: qlen, backlog, drops, requeues, overlimits
# struct tc_plug_xstats of the UML kernels' plug (kernels/patches-um/0005 and 0006): the
# MAC Control counts (24 bytes), then the shared pool's bytes held and most held.
PLUG_POOL_USED = struct.Struct("=24xI")
NO_POOL = 0xFFFFFFFF


def _attributes(data: bytes, offset: int = 0):
    while offset + RTATTR.size <= len(data):
        length, kind = RTATTR.unpack_from(data, offset)
        if length < RTATTR.size:
            return
        yield kind & 0x3FFF, data[offset + RTATTR.size:offset + length]
        offset += (length + 3) & ~3


def qdisc_stats(nl: socket.socket, seq: int):
    """(ifindex, handle major, qlen, backlog, drops, packets, pool) of every qdisc: pool
    is the bytes its shared pool holds (a plug in a pool), else NO_POOL."""
    body = TCMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
    nl.send(NLMSGHDR.pack(NLMSGHDR.size + len(body), RTM_GETQDISC, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body)
    while True:
        data = nl.recv(1 << 20)
        for kind, stats in qdisc_messages(data):
            if kind == NLMSG_DONE:
                return
            if kind == NLMSG_ERROR:
                raise OSError("RTM_GETQDISC dump failed")
            if kind == RTM_NEWQDISC:
                yield stats


def qdisc_messages(data: bytes):
    """(message type, (ifindex, handle major, qlen, backlog, drops, packets, pool)) of each
    message in one datagram (the statistics of an RTM_NEWQDISC, else None): a dump's
    part, or what an RTNLGRP_TC listener is told."""
    offset = 0
    while offset + NLMSGHDR.size <= len(data):
        length, kind, _, _, _ = NLMSGHDR.unpack_from(data, offset)
        stats = None
        if kind == RTM_NEWQDISC:
            _, ifindex, handle, _, _ = TCMSG.unpack_from(data, offset + NLMSGHDR.size)
            msg = data[offset + NLMSGHDR.size + TCMSG.size:offset + length]
            qlen = backlog = drops = packets = 0
            kind_name, pool = b"", NO_POOL
            for k, v in _attributes(msg):
                if k == TCA_KIND:
                    kind_name = v
                elif k == TCA_XSTATS and kind_name == b"plug\0" and len(v) >= PLUG_POOL_USED.size:
                    pool = PLUG_POOL_USED.unpack_from(v)[0]     # 0 where the plug is in no pool
                elif k == TCA_STATS2:
                    for k2, v2 in _attributes(v):
                        if k2 == TCA_STATS_QUEUE:
                            qlen, backlog, drops, _, _ = QUEUE.unpack_from(v2)
                        elif k2 == TCA_STATS_BASIC:
                            _, packets = BASIC.unpack_from(v2)
            stats = (ifindex, handle >> 16, qlen, backlog, drops, packets, pool)
        yield kind, stats
        if length < NLMSGHDR.size:
            return
        offset += (length + 3) & ~3
