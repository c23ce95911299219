"""Every ip, tc and ethtool command the testbed runs on links, namespaces and queues,
with one error style: a command that fails raises NetdevError naming the command and the
tool's own words. Nothing is hidden behind `|| true`: a link that is not up, an offload
left on or a qdisc not installed changes the experiment.

Why the iproute2 tools and, mostly, not a netlink library: a tc or ip batch is the
readable, replayable artifact a run saves (switch.tc, the hosts' scripts), and one batch
is one process. Measured on a 2-core VM with 64 veth pairs in a namespace: `ip -batch`
sets 64 links up in 16 ms and `ip -j link show` lists 129 links in 10 ms; pyroute2 0.7.2
(Debian 12) takes 329 ms to import, 83 ms to list the links of a namespace (NetNS forks a
helper) and 25 ms for the 64 link changes. Two exceptions, for a thousand hosts under
User-Mode Linux where every process costs tens of milliseconds: ethtool has no batch, so
offloads_off makes ethtool's own ioctl from this process; and a host's links, address,
route, neighbours and NIC queue are made over netlink (HostRtnl) from a thread already
in its namespace, with the messages ip and tc send (tests/test_netdev.py compares). The one netlink query the tools do not
answer cheaply (a process's sockets' TCP_INFO) is read with the standard library
(hosts/port_tcpinfo.py).
"""
from __future__ import annotations

import ctypes
import fcntl
import fnmatch
import json
import os
import socket
import struct
import subprocess

from pyroute2.iproute.linux import transform_handle
from pyroute2.netlink import NLM_F_ACK, NLM_F_CREATE, NLM_F_REPLACE, NLM_F_REQUEST
from pyroute2.netlink.rtnl import RTM_NEWQDISC, TC_H_ROOT
from pyroute2.netlink.rtnl.tcmsg.common import calc_xmittime

from incast.errors import RunFailed


class NetdevError(RunFailed):
    pass


def run(*argv: str, ns: str | None = None, input: str | None = None) -> str:
    """Run one ip/tc/ethtool command (in the named network namespace); its stdout."""
    cmd = ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
    r = subprocess.run(cmd, input=input, capture_output=True, text=True)
    if r.returncode:
        why = (r.stderr or r.stdout).strip().splitlines()
        shown = " ".join(argv) if input is None else f"{' '.join(argv)} ({input.count(chr(10))} lines)"
        raise NetdevError(f"`{shown}` failed: {why[-1] if why else f'exit status {r.returncode}'}")
    return r.stdout


def batch(tool: str, lines: list[str], ns: str | None = None, force: bool = False) -> None:
    """Run lines through `ip -batch` or `tc -batch` in one process. force: go on after a
    failed line (teardown), and raise for none."""
    if not lines:
        return
    if force:
        subprocess.run([tool, "-force", "-batch", "-"], input="\n".join(lines) + "\n", text=True,
                       capture_output=True)
        return
    run(tool, "-batch", "-", ns=ns, input="\n".join(lines) + "\n")


def version() -> str:
    return run("tc", "-V").strip()


def ifindexes(ns: str | None = None) -> dict[str, int]:
    """Interface name -> ifindex in this (or the named) network namespace."""
    return {link["ifname"]: link["ifindex"] for link in json.loads(run("ip", "-j", "link", "show", ns=ns))}


def qdiscs_by_dev(stats: bool = False) -> dict[str, list[dict]]:
    """Every device's qdiscs in this namespace, from one `tc` (a thousand switch ports
    read one `tc` each cost 39 s of host time under User-Mode Linux)."""
    out: dict[str, list[dict]] = {}
    for q in json.loads(run("tc", *(["-s"] if stats else []), "-j", "qdisc", "show") or "[]"):
        out.setdefault(q["dev"], []).append(q)
    return out


def add_veth(name: str, peer: str) -> None:
    run("ip", "link", "add", name, "type", "veth", "peer", "name", peer)


def delete_link(name: str) -> None:
    """Remove a link if it is still there (teardown: its namespace may be gone already)."""
    subprocess.run(["ip", "link", "del", name], capture_output=True)


def set_up(names: list[str], ns: str | None = None) -> None:
    batch("ip", [f"link set dev {n} up" for n in names], ns=ns)


def offloads_off_command(dev: str, tx_checksum: bool = False) -> str:
    # Without this the queues hold 64 KB GSO/GRO super-packets and a 32 KB buffer
    # drops nearly everything. tx_checksum: a software switch that forwards frames as
    # they are (bmv2) needs checksums complete when they leave the host, not left to a
    # NIC that veth does not have.
    return f"ethtool -K {dev} tso off gso off gro off" + (" tx off" if tx_checksum else "")


# linux/sockios.h and linux/ethtool.h.
SIOCETHTOOL = 0x8946
ETHTOOL_GSTRINGS, ETHTOOL_GSSET_INFO, ETHTOOL_SFEATURES = 0x1B, 0x37, 0x3B
ETH_SS_FEATURES = 4
ETH_GSTRING_LEN = 32
# ethtool -K's words as patterns over the kernel's feature names (ethtool's own table).
OFFLOAD_FEATURES = {"tso": "tx-tcp*-segmentation", "gso": "tx-generic-segmentation", "gro": "rx-gro",
                    "tx": "tx-checksum-*"}


def _ethtool(sock, dev: str, data: bytearray) -> None:
    """One SIOCETHTOOL call on dev with the command structure data (filled in place)."""
    buf = (ctypes.c_char * len(data)).from_buffer(data)
    ifreq = struct.pack("16sP", dev.encode(), ctypes.addressof(buf)).ljust(40, b"\0")
    fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifreq)


def _feature_names(sock, dev: str) -> list[str]:
    info = bytearray(struct.pack("=IIQI", ETHTOOL_GSSET_INFO, 0, 1 << ETH_SS_FEATURES, 0))
    _ethtool(sock, dev, info)
    count = struct.unpack_from("=I", info, 16)[0]
    strings = bytearray(struct.pack("=III", ETHTOOL_GSTRINGS, ETH_SS_FEATURES, count)
                        + bytes(count * ETH_GSTRING_LEN))
    _ethtool(sock, dev, strings)
    return [strings[12 + i * ETH_GSTRING_LEN:12 + (i + 1) * ETH_GSTRING_LEN].split(b"\0")[0].decode()
            for i in range(count)]


def offloads_off(devs: list[str], tx_checksum: bool = False) -> None:
    """offloads_off_command's changes, made by this process with ethtool's own ioctl (in
    the calling thread's network namespace): a thousand switch ports or hosts' NICs
    take a thousand ethtool processes otherwise, about 20 ms of host time each under
    User-Mode Linux."""
    words = ["tso", "gso", "gro"] + (["tx"] if tx_checksum else [])
    request = None      # the same for every device: the feature names are the kernel's
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for dev in devs:
            try:
                if request is None:
                    names = _feature_names(sock, dev)
                    valid = [0] * ((len(names) + 31) // 32)
                    for i, n in enumerate(names):
                        if any(fnmatch.fnmatchcase(n, OFFLOAD_FEATURES[w]) for w in words):
                            valid[i // 32] |= 1 << (i % 32)
                    request = struct.pack("=II", ETHTOOL_SFEATURES, len(valid)) + b"".join(
                        struct.pack("=II", v, 0) for v in valid)
                _ethtool(sock, dev, bytearray(request))
            except OSError as e:
                raise NetdevError(f"{offloads_off_command(dev, tx_checksum)} failed: {e.strerror}") from e


def netns_add(name: str) -> None:
    run("ip", "netns", "add", name)


def netns_add_many(names: list[str]) -> None:
    """Create named network namespaces, all in one process."""
    batch("ip", [f"netns add {n}" for n in names])


def netns_delete(names: list[str]) -> None:
    """Delete namespaces in one process, going on past any already gone (teardown)."""
    batch("ip", [f"netns del {n}" for n in names], force=True)


# --- qdiscs over netlink, from a thread that is already in the device's namespace ---
#
# Why: under User-Mode Linux a process costs tens of milliseconds of host time, and a
# thousand hosts' NICs made by one `tc` each took most of a 1020-host network's build.
# The messages are tc's own: the same attributes `tc qdisc replace ... tbf ...` and
# `... plug ...` send (iproute2 6.1's q_tbf.c, q_plug.c), so a qdisc made here reads
# back from `tc qdisc show` exactly as the tc line would have made it (a test compares).

# --- a plug that obeys MAC Control frames itself (kernels/patches-um/0005) and draws
# from a buffer shared with other plugs (kernels/patches-um/0006) ---
#
# Actions of struct tc_plug_qopt that neither tc nor pyroute2 has a word for, and the
# plug's TCA_XSTATS (struct tc_plug_xstats), over a netlink socket of the calling
# thread's namespace. A kernel whose plug lacks them refuses the actions with EINVAL.

TCQ_PLUG_OBEY, TCQ_PLUG_OBEY_PFC = 6, 7
# Join the pool whose id is limit (0: leave), set its size in bytes, its alpha in 1/16.
TCQ_PLUG_POOL, TCQ_PLUG_POOL_SIZE, TCQ_PLUG_POOL_ALPHA = 8, 9, 10
_NLMSGHDR = struct.Struct("=IHHII")
_TCMSG = struct.Struct("=BxxxiIII")           # family, ifindex, handle, parent, info
_RTATTR = struct.Struct("=HH")
_PLUG_QOPT = struct.Struct("=iI")             # action, limit
_PLUG_XSTATS = struct.Struct("=IIIIQ")        # pause, resume, PFC ignored, pad, paused ns
_PLUG_POOL_XSTATS = struct.Struct("=II")      # ... then (0006) the pool's bytes held, most held
_RTM_GETQDISC, _NLMSG_ERROR, _NLMSG_DONE, _NLM_F_DUMP = 38, 2, 3, 0x300
_TCA_KIND, _TCA_OPTIONS, _TCA_XSTATS = 1, 2, 4


def _rtattr(kind: int, payload: bytes) -> bytes:
    attr = _RTATTR.pack(_RTATTR.size + len(payload), kind) + payload
    return attr + b"\0" * (-len(attr) % 4)


def _rtattrs(data: bytes):
    offset = 0
    while offset + _RTATTR.size <= len(data):
        length, kind = _RTATTR.unpack_from(data, offset)
        if length < _RTATTR.size:
            return
        yield kind & 0x3FFF, data[offset + _RTATTR.size:offset + length]
        offset += (length + 3) & ~3


def _netlink_messages(sock, seq: int):
    """(type, payload) of each answer to request seq, until its ack or dump's end."""
    while True:
        data = sock.recv(1 << 16)
        offset = 0
        while offset + _NLMSGHDR.size <= len(data):
            length, kind, _, mseq, _ = _NLMSGHDR.unpack_from(data, offset)
            if length < _NLMSGHDR.size:
                return
            payload = data[offset + _NLMSGHDR.size:offset + length]
            offset += (length + 3) & ~3
            if mseq != seq:
                continue
            if kind == _NLMSG_ERROR:
                err = struct.unpack_from("=i", payload)[0]
                if err:
                    raise OSError(-err, os.strerror(-err))
                return
            if kind == _NLMSG_DONE:
                return
            yield kind, payload


def _plug_body(index: int, handle: str, parent: str, action: int, limit: int) -> bytes:
    """A plug qdisc's tcmsg with its tc_plug_qopt (action, limit)."""
    return (_TCMSG.pack(socket.AF_UNSPEC, index, transform_handle(handle), transform_handle(parent), 0)
            + _rtattr(_TCA_KIND, b"plug\0") + _rtattr(_TCA_OPTIONS, _PLUG_QOPT.pack(action, limit)))


def _qdiscs(messages, index: int):
    """(handle, attributes) of each qdisc of the device index in a qdisc dump's answers."""
    for kind, payload in messages:
        if kind == RTM_NEWQDISC and _TCMSG.unpack_from(payload)[1] == index:
            yield _TCMSG.unpack_from(payload)[2], dict(_rtattrs(payload[_TCMSG.size:]))


def plug_action(index: int, *, handle: str, parent: str, action: int, limit: int) -> None:
    """`tc qdisc change dev DEV parent P handle H plug` with a raw tc_plug_qopt action;
    raises OSError with the kernel's errno."""
    plug_actions([(index, handle, parent, action, limit)])


def plug_actions(actions: list[tuple[int, str, str, int, int]]) -> None:
    """plug_action for each (index, handle, parent, action, limit), in order, over one
    socket; raises OSError with the kernel's errno at the first it refuses."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as sock:
        for seq, (index, handle, parent, action, limit) in enumerate(actions, 1):
            body = _plug_body(index, handle, parent, action, limit)
            sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK,
                                     seq, 0) + body)
            for _ in _netlink_messages(sock, seq):
                pass


def plug_xstats(index: int, handle: str) -> dict | None:
    """The plug's MAC Control statistics (struct tc_plug_xstats): frames that paused
    and resumed it, PFC frames it ignored, the time it was paused, and where the kernel
    dumps them, the bytes its shared pool holds and the most it has held (pool_used,
    pool_max: 0 outside a pool); None where the plug dumps none (a kernel without them)."""
    want = transform_handle(handle)
    body = _TCMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
    found = None
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as sock:
        sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), _RTM_GETQDISC, NLM_F_REQUEST | _NLM_F_DUMP, 1, 0)
                  + body)
        for qhandle, attrs in _qdiscs(_netlink_messages(sock, 1), index):
            if qhandle != want:
                continue
            xstats = attrs.get(_TCA_XSTATS, b"")
            if attrs.get(_TCA_KIND) == b"plug\0" and len(xstats) >= _PLUG_XSTATS.size:
                pause, resume, ignored, _, paused_ns = _PLUG_XSTATS.unpack_from(xstats)
                found = {"pause_frames": pause, "resume_frames": resume, "pfc_ignored": ignored,
                         "paused_ns": paused_ns}
                if len(xstats) >= _PLUG_XSTATS.size + _PLUG_POOL_XSTATS.size:
                    found["pool_used"], found["pool_max"] = _PLUG_POOL_XSTATS.unpack_from(xstats, _PLUG_XSTATS.size)
    return found


# --- a host's links, address, route, neighbours and netem over netlink ---
#
# The messages `ip` and `tc` send for the lines a host used to be configured by, built
# here and sent from a thread already in the host's namespace: under User-Mode Linux a
# process costs about 30 ms of host time, and a host's ip and tc batches were two of
# them (2048 servers: 87 s of a 100 s run). tests/test_netdev.py compares what the
# kernel then holds with what the ip and tc lines give it.

_RTM_NEWLINK, _RTM_NEWADDR, _RTM_NEWROUTE, _RTM_GETROUTE, _RTM_NEWNEIGH, _RTM_GETNEIGH = 16, 20, 24, 26, 28, 30
_IFINFOMSG = struct.Struct("=BxHiII")         # family, type, index, flags, change
_IFADDRMSG = struct.Struct("=BBBBI")          # family, prefixlen, flags, scope, index
_RTMSG = struct.Struct("=BBBBBBBBI")          # family, dst_len, src_len, tos, table, protocol, scope, type, flags
_NDMSG = struct.Struct("=BxxxiHBB")           # family, ifindex, state, flags, type
_NETEM_QOPT = struct.Struct("=IIIIII")        # latency, limit, loss, gap, duplicate, jitter
_IFF_UP, _NUD_PERMANENT = 0x1, 0x80
_IFA_ADDRESS, _IFA_LOCAL = 1, 2
_RTA_DST, _RTA_OIF, _RTA_PREFSRC, _RTA_METRICS, _RTA_TABLE = 1, 4, 7, 8, 15
_NDA_DST, _NDA_LLADDR = 1, 2
_TCA_NETEM_LATENCY64, _TCA_NETEM_JITTER64 = 10, 11
_TCA_TBF_PARMS, _TCA_TBF_RATE64, _TCA_TBF_BURST = 1, 4, 6
_RATESPEC = struct.Struct("=BBHhHI")         # cell_log, linklayer, overhead, cell_align, mpu, rate
_TC_LINKLAYER_ETHERNET = 1
_PLUG_ACTIONS = {"release_indefinite": 2, "limit": 3}      # TCQ_PLUG_*
_RT_TABLE_MAIN, _RTPROT_KERNEL, _RT_SCOPE_LINK, _RTN_UNICAST = 254, 2, 253, 1
_PSCHED_TICK_NS = 64                          # the kernel's psched tick (PSCHED_SHIFT 6)
_RTAX_LOCK = 1
# Route metrics as ip names them, in the order `ip route` prints them (RTAX_*).
RTAX = {"initcwnd": 11, "features": 12, "rto_min": 13, "initrwnd": 14, "quickack": 15}
_RTAX_NAMES = {v: k for k, v in RTAX.items()}
# Requests a send carries: the kernel answers each with an ack of its own, and the
# socket's receive buffer counts each ack's whole buffer (about a kilobyte) against its
# 208 KiB: 512 acks at once overflow it (ENOBUFS).
_SEND_REQUESTS = 64


def _ip4(address: str) -> bytes:
    return socket.inet_aton(address)


class HostRtnl:
    """Requests for one host's namespace (the calling thread's), sent together by
    commit(): each acknowledged, the first refusal raised naming its request."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
        self.pending: list[tuple[bytes, str]] = []
        self.seq = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.sock.close()

    def _add(self, kind: int, flags: int, body: bytes, what: str) -> None:
        self.pending.append((struct.pack("=HH", kind, flags) + body, what))

    def link_up(self, index: int, what: str) -> None:
        """`ip link set dev DEV up`"""
        self._add(_RTM_NEWLINK, NLM_F_REQUEST | NLM_F_ACK,
                  _IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, _IFF_UP, _IFF_UP), f"link set dev {what} up")

    def address(self, index: int, address: str, prefixlen: int, what: str) -> None:
        """`ip address replace ADDRESS/PREFIXLEN dev DEV`"""
        self._add(_RTM_NEWADDR, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
                  _IFADDRMSG.pack(socket.AF_INET, prefixlen, 0, 0, index)
                  + _rtattr(_IFA_LOCAL, _ip4(address)) + _rtattr(_IFA_ADDRESS, _ip4(address)),
                  f"address replace {address}/{prefixlen} dev {what}")

    def link_route(self, index: int, dst: str, dst_len: int, src: str, metrics: dict[str, int], what: str) -> None:
        """`ip route replace DST/LEN dev DEV proto kernel scope link src SRC METRICS`
        (metrics by ip's names; rto_min in milliseconds, as the kernel keeps it)."""
        nested = b"".join(_rtattr(RTAX[k], struct.pack("=I", v)) for k, v in metrics.items())
        if "rto_min" in metrics:
            # ip locks it (RTAX_LOCK), and TCP reads a route's rto_min only where it is locked
            nested += _rtattr(_RTAX_LOCK, struct.pack("=I", 1 << RTAX["rto_min"]))
        self._add(_RTM_NEWROUTE, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
                  _RTMSG.pack(socket.AF_INET, dst_len, 0, 0, _RT_TABLE_MAIN, _RTPROT_KERNEL, _RT_SCOPE_LINK,
                              _RTN_UNICAST, 0)
                  + _rtattr(_RTA_DST, _ip4(dst)) + _rtattr(_RTA_PREFSRC, _ip4(src))
                  + _rtattr(_RTA_OIF, struct.pack("=I", index))
                  + (_rtattr(_RTA_METRICS, nested) if nested else b""),
                  f"route replace {dst}/{dst_len} dev {what} src {src} {metrics}")

    def neighbour(self, index: int, address: str, mac: str, what: str) -> None:
        """`ip neigh replace ADDRESS lladdr MAC dev DEV nud permanent`"""
        self._add(_RTM_NEWNEIGH, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
                  _NDMSG.pack(socket.AF_INET, index, _NUD_PERMANENT, 0, 0)
                  + _rtattr(_NDA_DST, _ip4(address)) + _rtattr(_NDA_LLADDR, bytes.fromhex(mac.replace(":", ""))),
                  f"neigh replace {address} lladdr {mac} dev {what}")

    def tbf(self, index: int, *, handle: str, rate_bps: int, burst: int, limit: int, overhead: int) -> None:
        """`tc qdisc replace dev DEV root handle H tbf rate R burst B limit L overhead O`.
        Like tc: the bucket in bytes (TCA_TBF_BURST, which the kernel takes as it is; the
        qopt's buffer in ticks, cut to 32 bits as tc's C conversion cuts it, would round
        it), TCA_TBF_RATE64 above 2^32 bytes/s, and ethernet for the link layer, so that
        the kernel wants no rate table."""
        rate = rate_bps // 8                 # tc_ratespec counts bytes per second
        ratespec = _RATESPEC.pack(0, _TC_LINKLAYER_ETHERNET, overhead, 0, 0, min(rate, 0xFFFFFFFF))
        qopt = ratespec + _RATESPEC.pack(0, 0, 0, 0, 0, 0) + struct.pack(
            "=III", limit, int(calc_xmittime(rate, burst)) & 0xFFFFFFFF, 0)
        opts = _rtattr(_TCA_TBF_PARMS, qopt) + _rtattr(_TCA_TBF_BURST, struct.pack("=I", burst))
        if rate >= 1 << 32:
            opts += _rtattr(_TCA_TBF_RATE64, struct.pack("=Q", rate))
        self._add(RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
                  _TCMSG.pack(socket.AF_UNSPEC, index, transform_handle(handle), TC_H_ROOT, 0)
                  + _rtattr(_TCA_KIND, b"tbf\0") + _rtattr(_TCA_OPTIONS, opts),
                  f"tbf on ifindex {index} (rate {rate_bps}bit burst {burst} limit {limit})")

    def plug(self, index: int, *, parent: str, handle: str, action: str, limit: int = 0,
             change: bool = False) -> None:
        """`tc qdisc replace|change dev DEV parent P handle H plug limit L|release_indefinite`
        (action: limit or release_indefinite)."""
        self._add(RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK | (0 if change else NLM_F_CREATE | NLM_F_REPLACE),
                  _plug_body(index, handle, parent, _PLUG_ACTIONS[action], limit),
                  f"plug {action} on ifindex {index}")

    def netem(self, index: int, *, parent: str, handle: str, limit: int, delay_us: float = 0,
              jitter_us: float = 0, loss_pct: float = 0, what: str = "") -> None:
        """`tc qdisc replace dev DEV parent P handle H netem limit L [delay D [J]] [loss X%]`,
        but the delay and jitter exact, in nanoseconds (TCA_NETEM_LATENCY64, JITTER64):
        tc 6.1 sends only the qopt's 64 ns ticks, which make 20 us 19.968."""
        delay_ns, jitter_ns = round(delay_us * 1000), round(jitter_us * 1000)
        opt = _NETEM_QOPT.pack(min(delay_ns // _PSCHED_TICK_NS, 0xFFFFFFFF), limit,
                               round(loss_pct / 100 * 0xFFFFFFFF), 0, 0,
                               min(jitter_ns // _PSCHED_TICK_NS, 0xFFFFFFFF))
        if delay_ns:
            opt += _rtattr(_TCA_NETEM_LATENCY64, struct.pack("=q", delay_ns))
        if jitter_ns:
            opt += _rtattr(_TCA_NETEM_JITTER64, struct.pack("=q", jitter_ns))
        self._add(RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE,
                  _TCMSG.pack(socket.AF_UNSPEC, index, transform_handle(handle), transform_handle(parent), 0)
                  + _rtattr(_TCA_KIND, b"netem\0") + _rtattr(_TCA_OPTIONS, opt),
                  f"qdisc replace dev {what} parent {parent} handle {handle} netem limit {limit} "
                  f"delay {delay_us}us {jitter_us}us loss {loss_pct}%")

    def commit(self) -> None:
        """Send every pending request, in order, and wait for each one's ack."""
        pending, self.pending = self.pending, []
        i = 0
        while i < len(pending):
            chunk, asked = [], {}
            while i < len(pending) and len(chunk) < _SEND_REQUESTS:
                kind_flags, body = pending[i][0][:4], pending[i][0][4:]
                self.seq += 1
                chunk.append(struct.pack("=I", _NLMSGHDR.size + len(body)) + kind_flags
                             + struct.pack("=II", self.seq, 0) + body)
                asked[self.seq] = pending[i][1]
                i += 1
            self.sock.send(b"".join(chunk))
            self._acks(asked)

    def _acks(self, asked: dict[int, str]) -> None:
        """Wait for the ack of every request in asked (seq -> what it asked)."""
        waiting = set(asked)
        while waiting:
            data = self.sock.recv(1 << 16)
            offset = 0
            while offset + _NLMSGHDR.size <= len(data):
                length, kind, _, seq, _ = _NLMSGHDR.unpack_from(data, offset)
                payload = data[offset + _NLMSGHDR.size:offset + length]
                offset += (length + 3) & ~3
                if kind == _NLMSG_ERROR and seq in waiting:
                    waiting.discard(seq)
                    err = struct.unpack_from("=i", payload)[0]
                    if err:
                        raise NetdevError(f"`{asked[seq]}` failed: {os.strerror(-err)}")

    def _dump(self, kind: int, body: bytes):
        self.seq += 1
        self.sock.send(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), kind, NLM_F_REQUEST | _NLM_F_DUMP, self.seq, 0)
                       + body)
        yield from _netlink_messages(self.sock, self.seq)

    def link_routes(self, index: int, dev: str) -> list[str]:
        """The main table's IPv4 routes out of the device, as `ip route show` prints them."""
        shown = []
        for kind, payload in self._dump(_RTM_GETROUTE, _RTMSG.pack(socket.AF_INET, 0, 0, 0, 0, 0, 0, 0, 0)):
            if kind != _RTM_NEWROUTE:
                continue
            _, dst_len, _, _, table, protocol, scope, _, _ = _RTMSG.unpack_from(payload)
            attrs = dict(_rtattrs(payload[_RTMSG.size:]))
            table = struct.unpack("=I", attrs[_RTA_TABLE])[0] if _RTA_TABLE in attrs else table
            if table != _RT_TABLE_MAIN or struct.unpack("=I", attrs.get(_RTA_OIF, b"\0" * 4))[0] != index:
                continue
            words = [f"{socket.inet_ntoa(attrs[_RTA_DST])}/{dst_len}" if _RTA_DST in attrs else "default",
                     "dev", dev]
            words += ["proto", {_RTPROT_KERNEL: "kernel"}.get(protocol, str(protocol))]
            words += ["scope", {_RT_SCOPE_LINK: "link"}.get(scope, str(scope))] if scope else []
            words += ["src", socket.inet_ntoa(attrs[_RTA_PREFSRC])] if _RTA_PREFSRC in attrs else []
            metrics = dict((k, struct.unpack("=I", v)[0]) for k, v in _rtattrs(attrs.get(_RTA_METRICS, b"")))
            locked = metrics.pop(_RTAX_LOCK, 0)
            for rtax, value in sorted(metrics.items()):
                name = _RTAX_NAMES.get(rtax, f"metric{rtax}")
                words += [name, *(["lock"] if locked & (1 << rtax) else []),
                          f"{value}ms" if name == "rto_min" else (hex(value) if name == "features" else str(value))]
            shown.append(" ".join(words))
        return shown

    def netem_ns(self, index: int) -> tuple[int, int] | None:
        """(delay, jitter) in nanoseconds of the device's netem as the kernel holds them
        (tc prints them cut to whole microseconds), or None where it has none."""
        for _, attrs in _qdiscs(self._dump(_RTM_GETQDISC, _TCMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)), index):
            if attrs.get(_TCA_KIND) == b"netem\0":
                nested = dict(_rtattrs(attrs[_TCA_OPTIONS][_NETEM_QOPT.size:]))
                return tuple(struct.unpack("=q", nested[k])[0] for k in (_TCA_NETEM_LATENCY64, _TCA_NETEM_JITTER64))
        return None

    def permanent_neighbours(self, index: int) -> int:
        """How many IPv4 neighbours of the device are permanent."""
        n = 0
        for kind, payload in self._dump(_RTM_GETNEIGH, _NDMSG.pack(socket.AF_INET, 0, 0, 0, 0)):
            if kind == _RTM_NEWNEIGH:
                _, ifindex, state, _, _ = _NDMSG.unpack_from(payload)
                n += ifindex == index and bool(state & _NUD_PERMANENT)
        return n
